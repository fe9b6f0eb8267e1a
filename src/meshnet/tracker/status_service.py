"""The SwarmStatus service: the live node table, read-only, for status pages and `meshnet status`."""

from __future__ import annotations

from dataclasses import replace

import grpc

from meshnet.core.errors import MeshnetError
from meshnet.core.swarm_status import NodeStatus, NodeTable
from meshnet.core.tracking import NodeLoad
from meshnet.tracker.admission import Admission
from meshnet.tracker.call_guards import admit_call
from meshnet.tracker.node_entry import NodeEntry
from meshnet.tracker.registry import NodeRegistry
from meshnet.wire import services
from meshnet.wire.status import abort_with
from meshnet.wire.status_wire import node_table_to_proto
from meshnet.wire.tls import LinkSecurity


def node_table(registry: NodeRegistry) -> NodeTable:
    """The registry as operators see it: every live node with its last load report."""
    now = registry.now()
    views = registry.node_views()
    routed = {view.node_id: view.decode_tokens_per_s for view in views}
    measured = registry.measured_nodes()
    return NodeTable(
        nodes=tuple(
            _node_status(entry, now, routed.get(entry.node_id, 0.0), entry.node_id in measured)
            for entry in registry.entries()
        ),
        epoch=registry.epoch,
        heartbeat_interval_s=registry.heartbeat_interval_s,
        expire_after_s=registry.expire_after_s,
    )


def _node_status(entry: NodeEntry, now: float, routed_rate: float, measured: bool) -> NodeStatus:
    load = entry.load or NodeLoad(free_sessions=entry.record.capability.max_sessions)
    return NodeStatus(
        node_id=entry.node_id,
        record=entry.record,
        # Routing inputs, not an operator's: peer latencies and the prefix tips (prompt hashes).
        load=replace(load, peer_rtt_ms=(), prefix_tips=()),
        seconds_since_heartbeat=max(0.0, now - entry.last_seen),
        routed_decode_tokens_per_s=routed_rate,
        speed_measured=measured,
        reachability=entry.reachability,
    )


class SwarmStatusServicer(services.SwarmStatusServicer):
    def __init__(
        self, registry: NodeRegistry, security: LinkSecurity | None = None, admission: Admission | None = None
    ) -> None:
        self._registry = registry
        self._security = security
        # The node table is a status call: the first thing shed while the tracker is behind.
        self.admission = admission or registry.admission

    async def ListNodes(
        self, request: services.ListNodesRequest, context: grpc.aio.ServicerContext
    ) -> services.NodeStatusList:
        try:
            with self.admission.counting():
                admit_call(self._security, context, "ListNodes")
                self.admission.check("probe")  # after authentication: a stranger gets no retry hint
                return node_table_to_proto(node_table(self._registry))
        except MeshnetError as error:
            await abort_with(context, error)
