"""A worker's Prometheus ``/metrics`` endpoint (``--metrics-port``).

It exposes the same ``ShardMetrics`` figures GetMetrics and the heartbeat report, read at each
scrape, so the three never disagree. The HTTP server runs on its own thread
(``telemetry.prometheus``); its ``close`` stops it.
"""

from __future__ import annotations

from meshnet.node.config import WorkerConfig
from meshnet.node.shard import AnyShard
from meshnet.telemetry.prometheus import MetricsEndpoint, build_registry, serve_metrics


def serve_worker_metrics(shard: AnyShard, config: WorkerConfig) -> MetricsEndpoint:
    """Start serving ``shard``'s figures on ``config.host:config.metrics_port`` (0 picks a port)."""
    registry = build_registry("meshnet_worker", lambda: shard.metrics().values(), {"layers": str(config.layers)})
    return serve_metrics(registry, config.host, config.metrics_port or 0)
