"""Conversions between swarm_status.proto messages and ``meshnet.core.swarm_status`` values.

A status tool reads what a tracker sends: every node's record and counts are validated here
(``InvalidArgument`` on a malformed one), and the list is cut at ``MAX_NODES``."""

from __future__ import annotations

from meshnet.core.errors import InvalidArgument
from meshnet.core.reachability import check_reachability
from meshnet.core.swarm_status import NodeStatus, NodeTable
from meshnet.core.tracking import NodeLoad
from meshnet.wire.generated import swarm_status_pb2 as pb
from meshnet.wire.node_wire import record_from_proto, record_to_proto
from meshnet.wire.tracker_wire import prefix_figures_fields, prefix_figures_from

MAX_NODES = 10_000
"""Nodes one reply may list: a bound on what a bad peer can make a status tool hold."""


def node_table_to_proto(table: NodeTable) -> pb.NodeStatusList:
    return pb.NodeStatusList(
        nodes=[_node_to_proto(node) for node in table.nodes],
        epoch=table.epoch,
        heartbeat_interval_s=table.heartbeat_interval_s,
        expire_after_s=table.expire_after_s,
    )


def node_table_from_proto(message: pb.NodeStatusList) -> NodeTable:
    return NodeTable(
        nodes=tuple(_node_from_proto(node) for node in message.nodes[:MAX_NODES]),
        epoch=message.epoch,
        heartbeat_interval_s=message.heartbeat_interval_s,
        expire_after_s=message.expire_after_s,
    )


def _node_to_proto(node: NodeStatus) -> pb.NodeStatusList.Node:
    load = node.load
    return pb.NodeStatusList.Node(
        node_id=node.node_id,
        record=record_to_proto(node.record),
        memory_used_bytes=load.memory_used_bytes,
        memory_budget_bytes=load.memory_budget_bytes,
        active_sessions=load.active_sessions,
        free_sessions=load.free_sessions,
        queue_depth=load.queue_depth,
        kv_used_fraction=load.kv_used_fraction,
        seconds_since_heartbeat=node.seconds_since_heartbeat,
        routed_decode_tokens_per_s=node.routed_decode_tokens_per_s,
        speed_measured=node.speed_measured,
        reachability=node.reachability,
        **prefix_figures_fields(load.prefix),
    )


def _node_from_proto(message: pb.NodeStatusList.Node) -> NodeStatus:
    if not message.HasField("record"):
        raise InvalidArgument(f"node {message.node_id[:64]!r} in the status table has no record")
    load = NodeLoad(
        active_sessions=message.active_sessions,
        free_sessions=message.free_sessions,
        queue_depth=message.queue_depth,
        kv_used_fraction=message.kv_used_fraction,
        memory_used_bytes=message.memory_used_bytes,
        memory_budget_bytes=message.memory_budget_bytes,
        prefix=prefix_figures_from(message),
    )
    return NodeStatus(
        message.node_id,
        record_from_proto(message.record),
        load,
        message.seconds_since_heartbeat,
        routed_decode_tokens_per_s=message.routed_decode_tokens_per_s,
        speed_measured=message.speed_measured,
        reachability=check_reachability(message.reachability),
    )
