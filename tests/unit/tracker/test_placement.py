"""Layer placement by memory, tested without a model."""

from __future__ import annotations

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.core.layers import LayerRange
from meshnet.tracker.placement import LayerCosts, plan_ranges

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
