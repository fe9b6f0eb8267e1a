"""A route run's wait for each answer is bounded by the step's measured budget (``RouteRun.within``,
``core.step_budget``).

A route whose hop stops answering fails with ``Unavailable`` naming the route and the step (the
swarm client fails that over like a lost hop); an honest step slower than a decode step but
within what its tokens take on the route's measured speeds (a long prefill chunk) is not cut; a
step queued behind other sessions waits on while every hop of its route answers them, a route
with a hop that answers nothing fails within one budget, and the renewals stop at the sessions a
hop admits.
Here the answer is an awaitable standing in for the head's stream, with margins scaled down: the
file takes a few seconds, most of it the renewal tests' windows of about half a second (wide
enough that a loaded runner's stall changes no count). tests/integration/test_swarm_hung_worker.py
wedges a real worker's engine behind the gateway.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterable

import pytest

from meshnet.core.errors import DeadlineExceeded, Unavailable
from meshnet.core.events import RouteHop
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeCapability
from meshnet.core.step_budget import StepBudget
from meshnet.node.ring import MAX_CHUNKS_IN_FLIGHT
from meshnet.route.hop_progress import HopProgress
from meshnet.route.route_run import CHUNKS_AHEAD, RouteRun, RouteSession
from meshnet.wire.frames import StepResult

BUDGET = StepBudget(factor=2.0, floor_s=0.05, link_s=0.0)
ANSWER = StepResult(SessionId("s"), 3, 10, 7)


def route(prefill: float = 1000.0, decode: float = 100.0) -> RouteSession:
    capability = NodeCapability(2048, 1, 2048, 1 << 24, 64, 4, prefill_tokens_per_s=prefill, decode_tokens_per_s=decode)
    hops = tuple(
        RouteHop(NodeId(name), f"{name}:1", LayerRange(index * 2, index * 2 + 2), capability)
        for index, name in enumerate(("head", "middle", "tail"))
    )
    return RouteSession(RequestId("r"), SessionId("s"), hops, "rcp", 1)


WINDOW = StepBudget(factor=2.0, floor_s=0.5, link_s=0.0)
"""The renewal tests' budget: 0.566 s for one decode token, so that a loaded machine's event-loop
stall (the other sessions' answers arrive every 20 ms) never looks like a stopped hop."""
WINDOW_S = 0.5 + 2 * 3 * (1 / 100 + 1 / 1000)


def run_on(session: RouteSession, progress: HopProgress | None = None, budget: StepBudget = BUDGET) -> RouteRun:
    request = GenerationRequest((1, 2, 3), 4)
    return RouteRun(session, request, None, None, None, budget, progress=progress)  # type: ignore[arg-type]


async def others_answering(progress: HopProgress, addresses: list[str], every_s: float = 0.02) -> None:
    """Other sessions' steps through ``addresses`` answered, one every ``every_s``, until cancelled."""
    while True:
        await asyncio.sleep(every_s)
        progress.answered(addresses)


class CountedProgress(HopProgress):
    """Counts the budget windows that ran out (each asks whether the hops moved)."""

    def __init__(self) -> None:
        super().__init__()
        self.expired_windows = 0

    def moving(self, addresses: Iterable[str], *, since: float, window_s: float) -> bool:
        self.expired_windows += 1
        return super().moving(addresses, since=since, window_s=window_s)


async def wait_while_others_answer(
    session: RouteSession, answer: Awaitable[StepResult], addresses: list[str], progress: HopProgress | None = None
) -> StepResult:
    progress = progress or HopProgress()
    progress.answered(h.address for h in session.hops)  # this session's own last answer: proves nothing later
    others = asyncio.create_task(others_answering(progress, addresses))
    try:
        return await run_on(session, progress, WINDOW).within(answer, 7, 1, prefill=False)
    finally:
        others.cancel()


async def answered_after(seconds: float) -> StepResult:
    await asyncio.sleep(seconds)
    return ANSWER


async def test_an_honest_long_prefill_chunk_is_not_cut() -> None:
    # 300 tokens through three hops at 1000 tokens/s: 0.9 s of work, budget 0.05 + 2 * 0.903.
    started = time.monotonic()
    result = await run_on(route()).within(answered_after(0.9), 0, 300, prefill=True)
    assert result == ANSWER and time.monotonic() - started >= 0.9


async def test_a_step_past_its_budget_fails_the_route_naming_it() -> None:
    # One decode token: 0.05 + 2 * 3 * (1/100 + 1/1000) = 0.116 s.
    started = time.monotonic()
    with pytest.raises(Unavailable) as caught:
        await run_on(route()).within(answered_after(30.0), 41, 1, prefill=False)
    waited = time.monotonic() - started
    assert 0.1 <= waited < 2.0, waited
    assert "step 41" in caught.value.message and "head:1, middle:1, tail:1" in caught.value.message


async def test_without_measured_speeds_only_the_answer_ends_the_wait() -> None:
    assert await run_on(route(prefill=0.0, decode=0.0)).within(answered_after(0.3), 0, 1, prefill=False) == ANSWER


async def test_an_error_from_the_route_itself_passes_through() -> None:
    async def fails() -> StepResult:
        raise DeadlineExceeded("the request's deadline passed")

    with pytest.raises(DeadlineExceeded):
        await run_on(route()).within(fails(), 0, 1, prefill=False)


async def test_a_step_queued_behind_other_sessions_waits_on_while_its_hops_answer_them() -> None:
    # The answer comes after ~2.5 windows, the hops answering other sessions meanwhile.
    started = time.monotonic()
    answer = await wait_while_others_answer(route(), answered_after(2.5 * WINDOW_S), ["head:1", "middle:1", "tail:1"])
    assert answer == ANSWER and time.monotonic() - started >= 2.5 * WINDOW_S


async def test_a_hop_that_answers_nothing_else_still_fails_the_step_in_one_budget() -> None:
    # The head and middle answer another route's steps; the tail answers nothing: it is hung.
    progress = CountedProgress()
    started = time.monotonic()
    with pytest.raises(Unavailable) as caught:
        await wait_while_others_answer(route(), answered_after(30.0), ["head:1", "middle:1"], progress)
    assert progress.expired_windows == 1 and WINDOW_S * 0.99 <= time.monotonic() - started < 10.0
    assert "step 7" in caught.value.message and "is hung" in caught.value.message


async def test_the_renewals_stop_at_the_sessions_a_hop_admits() -> None:
    # Every hop keeps answering, but no step waits for more than max_sessions (4) windows.
    progress = CountedProgress()
    started = time.monotonic()
    with pytest.raises(Unavailable):
        await wait_while_others_answer(route(), answered_after(30.0), ["head:1", "middle:1", "tail:1"], progress)
    waited = time.monotonic() - started
    assert progress.expired_windows == 4 and 4 * WINDOW_S * 0.99 <= waited < 20.0, waited


def test_the_driver_allows_for_as_many_chunks_ahead_as_the_head_keeps_in_flight() -> None:
    assert CHUNKS_AHEAD == MAX_CHUNKS_IN_FLIGHT
