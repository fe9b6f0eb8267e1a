"""Node tables for the status tests: one node per layer range, healthy unless told."""

from __future__ import annotations

from dataclasses import replace

from meshnet.core.layers import LayerRange
from meshnet.core.swarm_status import NodeStatus, NodeTable


def node(
    layers: str, *, model: str = "tiny", fingerprint: str = "f1", beat: float = 0.1, **changes: object
) -> NodeStatus:
    base = NodeStatus(
        node_id=f"n-{layers}-{fingerprint}",
        address=f"127.0.0.1:{7000 + LayerRange.parse(layers).start}",
        model=model,
        fingerprint=fingerprint,
        quantization="Q8_0",
        layers=LayerRange.parse(layers),
        n_layers=6,
        cpu_count=2,
        memory_bytes=1 << 30,
        memory_used_bytes=1 << 20,
        memory_budget_bytes=1 << 21,
        max_sessions=8,
        active_sessions=1,
        free_sessions=7,
        queue_depth=0,
        kv_used_fraction=0.125,
        prefill_tokens_per_s=100.0,
        decode_tokens_per_s=10.0,
        seconds_since_heartbeat=beat,
        certified=True,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def table(*nodes: NodeStatus) -> NodeTable:
    return NodeTable(nodes, epoch=3, heartbeat_interval_s=0.5, expire_after_s=1.5)
