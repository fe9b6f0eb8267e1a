"""A step's budget comes from what the route's nodes measured, with margins for a loaded machine.

The budget is what ends a wait for a hung hop (``route.route_run``), so it must be short for a
short step and long for a long one: a prefill chunk's grows with its tokens, so an honest long
chunk on a slow node is never cut, while a decode step on the same route is given up within
seconds."""

from __future__ import annotations

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.core.node_record import NodeCapability
from meshnet.core.step_budget import StepBudget

CHUNK = 256


def node(prefill: float, decode: float, chunk: int = CHUNK) -> NodeCapability:
    return NodeCapability(4096, chunk, 4096, 1 << 24, 64, 4, prefill_tokens_per_s=prefill, decode_tokens_per_s=decode)


def test_the_formula_floor_plus_factor_times_the_measured_cost_plus_the_links() -> None:
    budget = StepBudget(factor=3.0, floor_s=2.0, link_s=0.5)
    hops = [node(prefill=512.0, decode=20.0), node(prefill=256.0, decode=10.0)]
    # Each hop: its own step, plus one other session's chunk that may run on its engine first.
    decode_cost = (1 / 20 + CHUNK / 512) + (1 / 10 + CHUNK / 256)
    prefill_cost = (300 / 512 + CHUNK / 512) + (300 / 256 + CHUNK / 256)
    assert budget.seconds(hops, 1, prefill=False) == pytest.approx(2.0 + 3.0 * decode_cost + 2 * 0.5)
    assert budget.seconds(hops, 300, prefill=True) == pytest.approx(2.0 + 3.0 * prefill_cost + 2 * 0.5)


def test_an_honest_long_prefill_chunk_gets_a_budget_beyond_what_it_takes_on_a_slow_loaded_node() -> None:
    # A slow CPU node: 40 prefill tokens/s over its layers, so a 2048-token chunk takes 51 s idle.
    slow = [node(prefill=40.0, decode=4.0, chunk=2048)]
    idle_s = 2048 / 40
    budget_s = StepBudget().seconds(slow, 2048, prefill=True)
    assert budget_s is not None and budget_s > 2 * idle_s + 5.0, "twice as slow as measured still fits"
    # A decode step on that node may wait behind another session's whole chunk: that wait is in
    # its budget too, but its own work is one token, not 2048.
    decode_s = StepBudget().seconds(slow, 1, prefill=False)
    assert decode_s is not None and idle_s < decode_s < budget_s - 3 * idle_s


def test_budgets_grow_with_the_tokens_and_the_hops_and_never_fall_below_the_floor() -> None:
    fast = node(prefill=1e6, decode=1e5)
    budget = StepBudget()
    one = budget.seconds([fast], 1, prefill=False)
    assert one is not None and budget.floor_s <= one < budget.floor_s + 1.0
    slow = node(prefill=100.0, decode=10.0)
    sizes = [budget.seconds([slow], tokens, prefill=True) for tokens in (1, 64, 512, 4096)]
    assert sizes == sorted(sizes) and len(set(sizes)) == 4
    assert (budget.seconds([slow, slow], 64, prefill=True) or 0) > (budget.seconds([slow], 64, prefill=True) or 0)


def test_a_route_with_an_unmeasured_hop_gets_no_step_budget() -> None:
    measured = node(prefill=500.0, decode=50.0)
    assert StepBudget().seconds([measured, node(prefill=0.0, decode=0.0)], 1, prefill=False) is None
    assert StepBudget().seconds([measured, node(prefill=500.0, decode=0.0)], 1, prefill=False) is None
    assert StepBudget().seconds([node(prefill=0.0, decode=50.0)], 1, prefill=False) is None


@pytest.mark.parametrize(
    "fields", [{"factor": 0.5}, {"floor_s": -1.0}, {"link_s": float("nan")}, {"factor": float("inf")}]
)
def test_bad_margins_are_refused(fields: dict[str, float]) -> None:
    with pytest.raises(InvalidArgument):
        StepBudget(**fields)


def test_a_step_carries_at_least_one_token() -> None:
    with pytest.raises(InvalidArgument):
        StepBudget().seconds([node(prefill=500.0, decode=50.0)], 0, prefill=True)
