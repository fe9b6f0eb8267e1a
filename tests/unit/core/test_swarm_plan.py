"""``meshnet plan``'s planner: its split is the tracker's and the lab's, its parts add up to the one
cost model's count, and every limit and remedy it reports is exactly the boundary of what fits."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.core.kv_type import KvType
from meshnet.core.layer_costs import MIB, RUNTIME_BYTES, ModelFootprint, WorkerLoad, layer_costs
from meshnet.core.limits import MAX_CONTEXT
from meshnet.core.swarm_plan import SESSIONS_LIMIT, parse_size, plan_swarm, remedies
from meshnet.tracker.placement import plan_ranges

# SmolLM2-135M's figures (bench/results/worker-memory.json), rounded: 30 blocks, tied table.
SMOL = ModelFootprint(
    block_bytes=(2_200_000,) * 30,
    table_bytes=28_000_000,
    tail_weight_bytes=28_000_000,
    tied=True,
    n_embd=576,
    n_ff=1536,
    n_q=576,
    n_kv=384,
    n_vocab=49152,
    n_merges=48900,
    weight_types=2,
)
LOAD = WorkerLoad(sessions=8, context=2048, prefill_chunk=64)
TRAINED = 8192


def _budget(beyond_runtime_mib: int) -> int:
    """A node's budget: the runtime every worker carries plus this much for its share of the
    model, so a recalibrated runtime moves every budget here alike and each case stays a case."""
    return RUNTIME_BYTES + beyond_runtime_mib * MIB


def _fits(budgets: list[int], load: WorkerLoad) -> bool:
    return plan_swarm(SMOL, budgets, load, TRAINED).fits


@pytest.mark.parametrize(
    ("text", "expected"),
    [("24G", 24 * 2**30), ("512M", 512 * MIB), ("1.5GiB", 3 * 2**29), ("340MB", 340 * MIB), ("4096", 4096)],
)
def test_sizes_are_binary_units(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "G", "lots", "-1G", "0", "nan", "inf", "infG", "1e400"])
def test_a_bad_size_is_refused(text: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_size(text)


def test_the_split_is_the_placements_and_the_parts_add_up_to_the_cost_model() -> None:
    budgets = [_budget(293), _budget(193), _budget(193)]
    plan = plan_swarm(SMOL, budgets, LOAD, TRAINED)
    costs = layer_costs(SMOL, LOAD)
    assert [node.layers for node in plan.nodes] == plan_ranges(costs, budgets)
    for node in plan.nodes:
        parts = node.weights + node.kv + node.scratch + node.runtime + node.head_table + node.tail
        assert parts == node.total == costs.range_bytes(node.layers)
    assert plan.nodes[0].head_table > 0 and plan.nodes[-1].tail > 0
    assert plan.nodes[1].head_table == plan.nodes[1].tail == 0


def test_the_whole_model_on_one_node_counts_a_tied_table_once() -> None:
    node = plan_swarm(SMOL, [2**30], LOAD, TRAINED).nodes[0]
    parts = node.weights + node.kv + node.scratch + node.runtime + node.head_table + node.tail
    assert node.head_table == 0 and parts == node.total


def test_largest_context_and_most_sessions_are_the_boundaries() -> None:
    budgets = [_budget(233)] * 3
    plan = plan_swarm(SMOL, budgets, LOAD, TRAINED)
    assert plan.fits
    assert 2048 <= plan.largest_context < TRAINED
    assert _fits(budgets, replace(LOAD, context=plan.largest_context))
    assert not _fits(budgets, replace(LOAD, context=plan.largest_context + 1))
    assert plan.most_sessions >= 8
    assert _fits(budgets, replace(LOAD, sessions=plan.most_sessions))
    assert not _fits(budgets, replace(LOAD, sessions=plan.most_sessions + 1))


def test_the_context_stops_at_the_trained_length_and_sessions_at_the_search_bound() -> None:
    plan = plan_swarm(SMOL, [2**40] * 2, LOAD, TRAINED)
    assert plan.largest_context == TRAINED
    assert plan.most_sessions == SESSIONS_LIMIT


def test_a_model_that_does_not_fit_says_what_would_and_each_remedy_fits() -> None:
    budgets = [_budget(143), _budget(143)]
    plan = plan_swarm(SMOL, budgets, LOAD, TRAINED)
    assert not plan.fits
    fixes = remedies(SMOL, budgets, plan)
    assert fixes.more_memory == plan.shortfalls() and fixes.more_memory
    grown = list(budgets)
    for index, extra in fixes.more_memory:
        grown[index] += extra
    assert _fits(grown, LOAD)
    assert 0 < fixes.context < LOAD.context and _fits(budgets, replace(LOAD, context=fixes.context))
    assert 0 < fixes.sessions < LOAD.sessions and _fits(budgets, replace(LOAD, sessions=fixes.sessions))
    assert fixes.extra_node is None and not _fits([*budgets, _budget(143)], LOAD)


def test_one_more_node_is_offered_when_it_fits() -> None:
    budgets = [_budget(233), _budget(233)]
    fixes = remedies(SMOL, budgets, plan_swarm(SMOL, budgets, LOAD, TRAINED))
    assert fixes.extra_node == _budget(233) and _fits([*budgets, _budget(233)], LOAD)


def test_too_little_for_even_one_position_says_so() -> None:
    budgets = [_budget(43), _budget(43)]
    plan = plan_swarm(SMOL, budgets, LOAD, TRAINED)
    fixes = remedies(SMOL, budgets, plan)
    assert plan.largest_context == plan.most_sessions == fixes.single_session_context == 0
    assert fixes.extra_node is None


def test_bad_loads_and_node_counts_are_refused() -> None:
    with pytest.raises(InvalidArgument):
        plan_swarm(SMOL, [2**30], replace(LOAD, sessions=0), TRAINED)
    with pytest.raises(InvalidArgument):
        plan_swarm(SMOL, [2**30] * 31, LOAD, TRAINED)


def test_the_reuse_store_gets_what_the_budget_leaves_up_to_its_size() -> None:
    node = plan_swarm(SMOL, [_budget(233)] * 3, LOAD, TRAINED).nodes[1]
    assert node.reuse_store(2**40) == node.budget_bytes - node.total > 0
    assert node.reuse_store(MIB) == MIB


def test_a_quantized_kv_type_is_counted_and_offered_when_it_fits() -> None:
    budgets = [_budget(173)] * 3
    f16 = plan_swarm(SMOL, budgets, LOAD, TRAINED)
    q8 = plan_swarm(SMOL, budgets, replace(LOAD, kv_type=KvType.Q8_0), TRAINED)
    assert sum(n.kv for n in q8.nodes) * 2 * 32 == sum(n.kv for n in f16.nodes) * 34
    assert not f16.fits and q8.fits and q8.largest_context > f16.largest_context
    fixes = remedies(SMOL, budgets, f16)
    assert fixes.kv_type is KvType.Q8_0
    q4 = remedies(SMOL, [_budget(143)] * 3, plan_swarm(SMOL, [_budget(143)] * 3, LOAD, TRAINED))
    assert q4.kv_type is KvType.Q4_0 and _fits([_budget(143)] * 3, replace(LOAD, kv_type=KvType.Q4_0))
    assert remedies(SMOL, [_budget(123)] * 3, plan_swarm(SMOL, [_budget(123)] * 3, LOAD, TRAINED)).kv_type is None


def test_the_readmes_auto_layers_example_covers_the_model_and_the_old_one_did_not() -> None:
    """README, Across real machines: three machines of 340 MiB at a worker's defaults serve all of
    SmolLM2 (``test_worker_auto_layers`` starts them); the 158 MiB it once gave holds nothing."""
    recorded = Path(__file__).resolve().parents[3] / "bench" / "results" / "worker-memory.json"
    figures = json.loads(recorded.read_text())["footprints"]["SmolLM2-135M-Instruct.Q4_1.gguf"]
    smollm2 = ModelFootprint(**{**figures, "block_bytes": tuple(figures["block_bytes"])})
    assert plan_swarm(smollm2, [340 * MIB] * 3, LOAD, TRAINED).fits
    old = plan_swarm(smollm2, [158 * MIB] * 3, LOAD, TRAINED)
    assert not old.fits and old.largest_context == old.most_sessions == 0


def test_the_context_stops_at_128k_whatever_the_model_was_trained_for() -> None:
    # Workers refuse a session past MAX_CONTEXT (limits.served_context): the plan must not offer one.
    plan = plan_swarm(SMOL, [2**40] * 2, replace(LOAD, sessions=1), 1_048_576)
    assert plan.largest_context == plan.max_context == MAX_CONTEXT
