"""Node tables for the status tests: one node per layer range, healthy unless told.

Recipes are named by a short key (``"f1"``, ``"f2"``): two keys are two recipes of one model."""

from __future__ import annotations

from dataclasses import replace

from meshnet.core.layers import LayerRange
from meshnet.core.node_record import Certification, HardwareSummary, NodeCapability, NodeRecord
from meshnet.core.recipe import Recipe
from meshnet.core.swarm_status import NodeStatus, NodeTable
from meshnet.core.tracking import NodeLoad


def recipe(key: str = "f1") -> Recipe:
    return Recipe(key.ljust(64, "0"), "llama", "1", "Q8_0", "f32", "f16", "llama.cpp", "0.3.36", 6, 8)


def record(layers: str, *, model: str = "tiny", fingerprint: str = "f1") -> NodeRecord:
    served = recipe(fingerprint)
    range_ = LayerRange.parse(layers)
    return NodeRecord(
        address=f"127.0.0.1:{7000 + range_.start}",
        recipe=served,
        fingerprint=served.fingerprint(),
        model=model,
        quantization="Q8_0",
        layers=range_,
        hardware=HardwareSummary(cpu_count=2, memory_bytes=1 << 30),
        capability=NodeCapability(256, 64, 256, 4 << 20, 8, 8, "cpu", 100.0, 10.0),
        certification=Certification.seal(served.fingerprint(), "0.3.36", ("bit-identical",), "ab" * 32, "ab" * 32),
    )


def node(
    layers: str, *, model: str = "tiny", fingerprint: str = "f1", beat: float = 0.1, **changes: object
) -> NodeStatus:
    served = record(layers, model=model, fingerprint=fingerprint)
    load = NodeLoad(1, 7, 0, 0.125, memory_used_bytes=1 << 20, memory_budget_bytes=1 << 21)
    base = NodeStatus(node_id=f"n-{layers}-{fingerprint}", record=served, load=load, seconds_since_heartbeat=beat)
    return replace(base, **changes)  # type: ignore[arg-type]


def table(*nodes: NodeStatus) -> NodeTable:
    return NodeTable(nodes, epoch=3, heartbeat_interval_s=0.5, expire_after_s=1.5)
