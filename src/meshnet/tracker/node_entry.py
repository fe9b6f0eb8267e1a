"""One live node as the registry holds it (``NodeEntry``), and the clock the tracker reads.

A frozen record: the registry replaces an entry on every heartbeat, and the route index, the
status service and the replicas' exchange read entries without copying them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from meshnet.core.ids import NodeId
from meshnet.core.node_record import NodeRecord
from meshnet.core.reachability import Reachability, is_routable
from meshnet.core.tracking import NodeLoad
from meshnet.tracker.route_costs import NodeView

Clock = Callable[[], float]
"""Seconds on a monotonic scale; ``time.monotonic`` in production, a fake in tests."""


@dataclass(frozen=True)
class NodeEntry:
    node_id: NodeId
    record: NodeRecord
    registered_at: float
    last_seen: float
    load: NodeLoad | None = None
    routed_since_heartbeat: int = 0
    """Sessions routed here since its last heartbeat. They are subtracted from the node's last
    reported free sessions, so a burst between two heartbeats does not all land on the fastest
    node; the next heartbeat's report already counts them."""
    reachability: Reachability = "public"
    """How others dial it (``core.reachability``): a ``private`` node is in the table (status,
    heartbeats) but never in a route, a probe list or the latency table."""

    @property
    def routable(self) -> bool:
        return is_routable(self.reachability)

    def view(self) -> NodeView:
        capability = self.record.capability
        reported_free = self.load.free_sessions if self.load else capability.max_sessions
        return NodeView(
            node_id=self.node_id,
            record=self.record,
            decode_tokens_per_s=capability.decode_tokens_per_s,
            free_sessions=reported_free - self.routed_since_heartbeat,
            queue_depth=self.load.queue_depth if self.load else 0,
        )
