"""The one memory cost model: calibrated on real workers, and the plan, ``--layers auto`` and the
tracker's placement agree because they all count with it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.core.kv_type import KvType
from meshnet.core.layer_costs import (
    MIB,
    LayerCosts,
    ModelFootprint,
    WorkerLoad,
    kv_bytes_per_layer,
    layer_costs,
    sessions_within,
    worker_bytes,
)
from meshnet.core.layers import LayerRange
from meshnet.tracker.placement import ServedSpan, suggest_layers

MEASURED = Path(__file__).resolve().parents[3] / "bench" / "results" / "worker-memory.json"
"""Real workers' resident sizes (``scripts/measure_worker_memory.py``), with each model's footprint."""
OVER_AT_MOST = 0.16
"""The model may count this much above a measured worker (never below it): the runtime's margin
for the spread between runs is a few MiB, 2% of a 145 MiB worker of the tiny synthetic model."""


def _recorded() -> dict[str, Any]:
    return json.loads(MEASURED.read_text())  # type: ignore[no-any-return]


def _footprint(figures: dict[str, Any]) -> ModelFootprint:
    return ModelFootprint(**{**figures, "block_bytes": tuple(figures["block_bytes"])})


SMOLLM2 = _footprint(_recorded()["footprints"]["SmolLM2-135M-Instruct.Q4_1.gguf"])


def _measured() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{w['model'][:8]} {w['layers']} x{w['sessions']}", w) for w in _recorded()["workers"]]


@pytest.mark.parametrize(("name", "worker"), _measured(), ids=[name for name, _ in _measured()])
def test_the_model_covers_every_measured_worker_closely(name: str, worker: dict[str, Any]) -> None:
    footprint = _footprint(_recorded()["footprints"][worker["model"]])
    load = WorkerLoad(worker["sessions"], worker["context"], worker["prefill_chunk"])
    predicted = worker_bytes(footprint, LayerRange.parse(worker["layers"]), load)
    measured = worker["after_load"]["VmRSS"]
    assert measured <= predicted <= measured * (1 + OVER_AT_MOST), (
        f"{name}: model {predicted / MIB:.1f} MiB, measured {measured / MIB:.1f} MiB"
    )


def test_a_range_costs_its_parts() -> None:
    load = WorkerLoad(sessions=2, context=2048, prefill_chunk=256)
    costs = layer_costs(SMOLLM2, load)
    middle, head, tail = LayerRange(10, 20), LayerRange(0, 10), LayerRange(20, 30)
    # KV: f16 keys and values, 192 wide each (3 of 9 heads of 64), per position, layer, session.
    assert costs.kv_bytes_per_layer == 2 * 2048 * 384 * 2
    weights = sum(SMOLLM2.block_bytes[10:20])
    assert costs.range_bytes(middle) == costs.fixed_bytes + weights + 10 * costs.kv_bytes_per_layer
    assert costs.range_bytes(head) - costs.range_bytes(middle) == costs.head_bytes  # same-sized blocks
    assert costs.range_bytes(tail) - costs.range_bytes(middle) == costs.tail_bytes
    # The tail carries the tied LM head (the token table), more than a head's resident share of it.
    assert costs.tail_bytes > SMOLLM2.table_bytes >= costs.head_bytes > 0


def test_the_whole_model_holds_a_tied_table_once() -> None:
    costs = layer_costs(SMOLLM2, WorkerLoad(1, 2048, 256))
    whole = LayerRange(0, 30)
    parts = costs.fixed_bytes + sum(SMOLLM2.block_bytes) + 30 * costs.kv_bytes_per_layer
    assert costs.range_bytes(whole) == parts + costs.tail_bytes  # the head's share is the tail's table
    untied = layer_costs(ModelFootprint(**{**vars(SMOLLM2), "tied": False}), WorkerLoad(1, 2048, 256))
    assert untied.range_bytes(whole) == parts + untied.tail_bytes + untied.head_bytes


def test_sessions_within_is_the_most_that_fit() -> None:
    load = WorkerLoad(sessions=8, context=2048, prefill_chunk=256)
    layers = LayerRange(10, 20)
    for sessions in (1, 3, 8):
        budget = worker_bytes(SMOLLM2, layers, WorkerLoad(sessions, 2048, 256))
        assert sessions_within(SMOLLM2, layers, load, budget) == sessions
        if sessions < 8:
            assert sessions_within(SMOLLM2, layers, load, budget - 1) == sessions - 1
    assert sessions_within(SMOLLM2, layers, load, 10**12) == 8  # never more than asked for
    assert sessions_within(SMOLLM2, layers, load, 50 * MIB) == 0  # not the runtime even


@pytest.mark.parametrize("budget_mib", [180, 220, 260, 320, 400])
@pytest.mark.parametrize("sessions", [1, 4, 8])
def test_the_range_the_tracker_suggests_holds_every_session_the_worker_asked_for(
    budget_mib: int, sessions: int
) -> None:
    """A worker asks with its costs; whatever range comes back, its own capacity plan (the same
    model) keeps every session: placement and plan cannot disagree."""
    load = WorkerLoad(sessions, 2048, 256)
    costs, budget = layer_costs(SMOLLM2, load), budget_mib * MIB
    served: list[ServedSpan] = []
    for _ in range(4):
        try:
            layers = suggest_layers(costs, budget, served).layers
        except InvalidArgument:  # not one layer fits this budget: nothing to plan
            return
        assert sessions_within(SMOLLM2, layers, load, budget) == sessions
        served.append(ServedSpan(layers, 1.0))


def test_wire_costs_carry_the_tied_table() -> None:
    costs = LayerCosts(block_bytes=(1,) * 4, kv_bytes_per_layer=0, head_bytes=5, tail_bytes=9, tied_bytes=5)
    assert costs.range_bytes(LayerRange(0, 4)) == 4 + 9
    assert costs.range_bytes(LayerRange(0, 2)) == 2 + 5


@pytest.mark.parametrize(
    ("kv_type", "bytes_per_position"),
    # SmolLM2 keys and values are 384 values a position and layer: f16 2 bytes each, q8_0 and q4_0
    # 12 blocks of 32 at 34 and 18 bytes (ggml's block_q8_0 and block_q4_0).
    [(KvType.F16, 384 * 2), (KvType.Q8_0, 12 * 34), (KvType.Q4_0, 12 * 18)],
)
def test_kv_bytes_follow_the_kv_type(kv_type: KvType, bytes_per_position: int) -> None:
    assert kv_bytes_per_layer(SMOLLM2, 2048, kv_type) == 2048 * bytes_per_position
    costs = layer_costs(SMOLLM2, WorkerLoad(sessions=3, context=2048, prefill_chunk=256, kv_type=kv_type))
    assert costs.kv_bytes_per_layer == 3 * 2048 * bytes_per_position


def test_a_quantized_kv_holds_more_sessions_in_the_same_budget() -> None:
    layers, f16 = LayerRange(0, 30), WorkerLoad(sessions=64, context=8192, prefill_chunk=256)
    budget = worker_bytes(SMOLLM2, layers, replace(f16, sessions=4))
    assert sessions_within(SMOLLM2, layers, f16, budget) == 4
    assert sessions_within(SMOLLM2, layers, replace(f16, kv_type=KvType.Q8_0), budget) == 7
    assert sessions_within(SMOLLM2, layers, replace(f16, kv_type=KvType.Q4_0), budget) == 13


def test_kv_types_parse_by_their_ggml_names() -> None:
    assert [KvType.parse(name) for name in ("f16", "q8_0", "q4_0")] == list(KvType)
    with pytest.raises(InvalidArgument, match="q8_0"):
        KvType.parse("q8")
    assert KvType.Q4_0.row_bytes(33) == 2 * 18  # a partial block is stored whole
