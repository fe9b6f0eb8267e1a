"""A worker's Prometheus ``/metrics`` endpoint (``--metrics-port``).

It exposes the same ``ShardMetrics`` figures GetMetrics and the heartbeat report, read at each
scrape, so the three never disagree. The HTTP server runs on its own thread
(``telemetry.prometheus``); ``close`` stops it.
"""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from meshnet.node.config import WorkerConfig
from meshnet.node.shard import AnyShard
from meshnet.telemetry.prometheus import build_registry, serve_metrics


class MetricsEndpoint:
    def __init__(self, server: WSGIServer, address: str) -> None:
        self._server = server
        self.address = address
        """host:port the endpoint listens on (the ready line names it)."""

    def close(self) -> None:
        self._server.shutdown()


def serve_worker_metrics(shard: AnyShard, config: WorkerConfig) -> MetricsEndpoint:
    """Start serving ``shard``'s figures on ``config.host:config.metrics_port`` (0 picks a port)."""
    registry = build_registry("meshnet_worker", lambda: shard.metrics().values(), {"layers": str(config.layers)})
    server, port = serve_metrics(registry, config.host, config.metrics_port or 0)
    return MetricsEndpoint(server, f"{config.host}:{port}")
