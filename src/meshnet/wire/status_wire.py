"""Conversions between swarm_status.proto messages and ``meshnet.core.swarm_status`` values."""

from __future__ import annotations

from meshnet.core.layers import LayerRange
from meshnet.core.swarm_status import NodeStatus, NodeTable
from meshnet.wire.generated import swarm_status_pb2 as pb

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
    return pb.NodeStatusList.Node(
        node_id=node.node_id,
        address=node.address,
        model=node.model,
        fingerprint=node.fingerprint,
        quantization=node.quantization,
        layer_start=node.layers.start,
        layer_stop=node.layers.stop,
        n_layers=node.n_layers,
        cpu_count=node.cpu_count,
        memory_bytes=node.memory_bytes,
        memory_used_bytes=node.memory_used_bytes,
        memory_budget_bytes=node.memory_budget_bytes,
        max_sessions=node.max_sessions,
        active_sessions=node.active_sessions,
        free_sessions=node.free_sessions,
        queue_depth=node.queue_depth,
        kv_used_fraction=node.kv_used_fraction,
        prefill_tokens_per_s=node.prefill_tokens_per_s,
        decode_tokens_per_s=node.decode_tokens_per_s,
        seconds_since_heartbeat=node.seconds_since_heartbeat,
        certified=node.certified,
    )


def _node_from_proto(message: pb.NodeStatusList.Node) -> NodeStatus:
    return NodeStatus(
        node_id=message.node_id,
        address=message.address,
        model=message.model,
        fingerprint=message.fingerprint,
        quantization=message.quantization,
        layers=LayerRange(message.layer_start, message.layer_stop),
        n_layers=message.n_layers,
        cpu_count=message.cpu_count,
        memory_bytes=message.memory_bytes,
        memory_used_bytes=message.memory_used_bytes,
        memory_budget_bytes=message.memory_budget_bytes,
        max_sessions=message.max_sessions,
        active_sessions=message.active_sessions,
        free_sessions=message.free_sessions,
        queue_depth=message.queue_depth,
        kv_used_fraction=message.kv_used_fraction,
        prefill_tokens_per_s=message.prefill_tokens_per_s,
        decode_tokens_per_s=message.decode_tokens_per_s,
        seconds_since_heartbeat=message.seconds_since_heartbeat,
        certified=message.certified,
    )
