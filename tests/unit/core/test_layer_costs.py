"""The one memory cost model: calibrated on real workers, and the plan, ``--layers auto`` and the
tracker's placement agree because they all count with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.core.layer_costs import (
    MIB,
    LayerCosts,
    ModelFootprint,
    WorkerLoad,
    layer_costs,
    sessions_within,
    worker_bytes,
)
from meshnet.core.layers import LayerRange
from meshnet.tracker.placement import ServedSpan, suggest_layers

MEASURED = Path(__file__).resolve().parents[3] / "bench" / "results" / "worker-memory.json"
"""Real workers' resident sizes (``scripts/measure_worker_memory.py``), with each model's footprint."""
OVER_AT_MOST = 0.15
"""The model may count this much above a measured worker (never below it)."""


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
