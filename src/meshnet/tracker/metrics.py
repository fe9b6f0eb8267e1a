"""The tracker's Prometheus ``/metrics`` endpoint (``--metrics-port``): calls it served, by replica.

Every figure carries a ``replica`` label (``stores.replica_id``: ``--replica-id``, else
HOST:PORT), so with several replicas sharing a store one scrape of each shows how the swarm's
nodes spread over them: heartbeats and registrations each replica answered, and the nodes it
holds live now. The HTTP server runs on its own thread (``telemetry.prometheus``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from meshnet.telemetry.prometheus import MetricsEndpoint, build_registry, serve_metrics


@dataclass
class ServedCalls:
    """Calls this replica answered since it started; the servicer counts, scrapes read."""

    heartbeats: int = 0
    """Heartbeats answered, unary or streamed, from known and unknown nodes alike: the load."""
    registrations: int = 0
    """Registrations accepted (the node was told it is registered)."""

    def figures(self, live_nodes: int) -> dict[str, float]:
        return {
            "heartbeats_total": float(self.heartbeats),
            "registrations_total": float(self.registrations),
            "live_nodes": float(live_nodes),
        }


def serve_tracker_metrics(
    calls: ServedCalls, live_nodes: Callable[[], int], replica: str, host: str, port: int
) -> MetricsEndpoint:
    """Serve ``calls`` (and ``live_nodes()``, read at each scrape) labelled ``replica`` on
    ``host:port`` (0 picks a port)."""
    registry = build_registry("meshnet_tracker", lambda: calls.figures(live_nodes()), {"replica": replica})
    return serve_metrics(registry, host, port)
