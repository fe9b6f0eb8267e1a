"""Layer placement by memory, tested without a model."""

from __future__ import annotations

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.core.layer_costs import LayerCosts
from meshnet.core.layers import LayerRange
from meshnet.tracker.placement import plan_ranges

MB = 2**20


def test_equal_nodes_and_layers_split_evenly() -> None:
    costs = LayerCosts(block_bytes=(MB,) * 30, kv_bytes_per_layer=0)
    assert plan_ranges(costs, [20 * MB] * 3) == [LayerRange(0, 10), LayerRange(10, 20), LayerRange(20, 30)]


def test_a_tail_with_a_large_lm_head_gets_fewer_layers() -> None:
    costs = LayerCosts(block_bytes=(2 * MB,) * 30, kv_bytes_per_layer=2 * MB, tail_bytes=32 * MB)
    ranges = plan_ranges(costs, [100 * MB] * 3)
    assert ranges[0].start == 0 and ranges[-1].stop == 30
    assert len(ranges[2]) < len(ranges[0])
    assert max(costs.range_bytes(r) for r in ranges) <= 100 * MB


def test_a_bigger_node_gets_more_layers() -> None:
    costs = LayerCosts(block_bytes=(MB,) * 12, kv_bytes_per_layer=0)
    assert plan_ranges(costs, [30 * MB, 10 * MB]) == [LayerRange(0, 9), LayerRange(9, 12)]


def test_the_best_split_is_optimal_against_brute_force() -> None:
    blocks = (3, 1, 4, 1, 5, 9, 2, 6)
    costs = LayerCosts(block_bytes=blocks, kv_bytes_per_layer=1, head_bytes=2, tail_bytes=7, fixed_bytes=1)
    budgets = [40, 30, 50]
    chosen = plan_ranges(costs, budgets)
    worst = max(costs.range_bytes(r) / b for r, b in zip(chosen, budgets, strict=True))
    brute = min(
        max(
            costs.range_bytes(LayerRange(0, a)) / 40,
            costs.range_bytes(LayerRange(a, b)) / 30,
            costs.range_bytes(LayerRange(b, 8)) / 50,
        )
        for a in range(1, 7)
        for b in range(a + 1, 8)
    )
    assert worst == pytest.approx(brute)


def test_a_model_that_cannot_fit_is_refused_with_the_numbers() -> None:
    costs = LayerCosts(block_bytes=(10 * MB,) * 6, kv_bytes_per_layer=0)
    with pytest.raises(InvalidArgument, match=r"does not fit these 2 nodes.*30 MiB against its 20 MiB"):
        plan_ranges(costs, [20 * MB, 20 * MB])
    with pytest.raises(InvalidArgument):
        plan_ranges(costs, [MB] * 7)


# -- suggest_layers: one joining worker's range -------------------------------------------------

from meshnet.tracker.placement import ServedSpan, suggest_layers  # noqa: E402

FLAT = LayerCosts(block_bytes=(MB,) * 30, kv_bytes_per_layer=0)


def test_the_first_worker_of_an_empty_swarm_starts_at_the_head() -> None:
    advice = suggest_layers(FLAT, 12 * MB, [])
    assert advice.layers == LayerRange(0, 12) and advice.reason == "uncovered layers"


def test_joiners_continue_where_the_last_one_stopped_until_every_layer_is_covered() -> None:
    served: list[ServedSpan] = []
    for expected in (LayerRange(0, 12), LayerRange(12, 24), LayerRange(24, 30)):
        advice = suggest_layers(FLAT, 12 * MB, served)
        assert advice.layers == expected
        served.append(ServedSpan(advice.layers, 10.0))


def test_a_gap_in_the_middle_is_filled_before_anything_is_replicated() -> None:
    served = [ServedSpan(LayerRange(0, 10), 5.0), ServedSpan(LayerRange(20, 30), 5.0)]
    assert suggest_layers(FLAT, 25 * MB, served).layers == LayerRange(10, 20)


def test_a_range_never_ends_inside_a_served_range_where_no_route_could_leave_it() -> None:
    # 15 layers fit, but stopping at 15 would end inside 10:20, which no hop starts at.
    served = [ServedSpan(LayerRange(0, 10), 5.0), ServedSpan(LayerRange(10, 20), 5.0)]
    assert suggest_layers(FLAT, 15 * MB, served).layers == LayerRange(20, 30)


def test_with_every_layer_covered_the_fewest_replicas_then_the_slowest_span_wins() -> None:
    served = [
        ServedSpan(LayerRange(0, 10), 9.0),
        ServedSpan(LayerRange(0, 10), 9.0),
        ServedSpan(LayerRange(10, 20), 3.0),
        ServedSpan(LayerRange(20, 30), 7.0),
    ]
    advice = suggest_layers(FLAT, 10 * MB, served)
    assert advice.layers == LayerRange(10, 20) and advice.reason == "1 replica(s), the fewest"


def test_a_large_budget_replicates_a_longer_chain_of_the_weakest_spans() -> None:
    served = [ServedSpan(LayerRange(0, 10), 9.0), ServedSpan(LayerRange(10, 30), 2.0)]
    assert suggest_layers(FLAT, 30 * MB, served).layers == LayerRange(0, 30)


def test_the_tail_cost_bounds_the_last_range() -> None:
    costs = LayerCosts(block_bytes=(MB,) * 30, kv_bytes_per_layer=MB, tail_bytes=8 * MB, fixed_bytes=4 * MB)
    served = [ServedSpan(LayerRange(0, 20), 1.0)]
    # 4 fixed + 2 per layer: ten layers fit mid-model, but one reaching the tail adds 8.
    first = suggest_layers(costs, 24 * MB, served).layers
    assert first == LayerRange(20, 29)
    assert suggest_layers(costs, 24 * MB, [*served, ServedSpan(first, 1.0)]).layers == LayerRange(29, 30)


def test_nothing_fits_is_a_clear_error() -> None:
    with pytest.raises(InvalidArgument, match="not one layer of this model fits"):
        suggest_layers(LayerCosts(block_bytes=(10 * MB,) * 4, kv_bytes_per_layer=0), 5 * MB, [])
