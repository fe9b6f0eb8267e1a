"""A route run's wait for each answer is bounded by the step's measured budget (``RouteRun.within``,
``core.step_budget``).

A route whose hop stops answering fails with ``Unavailable`` naming the route and the step (the
swarm client fails that over like a lost hop); an honest step slower than a decode step but
within what its tokens take on the route's measured speeds (a long prefill chunk) is not cut.
Here the answer is an awaitable standing in for the head's stream, with margins scaled down so
the test takes well under a second; tests/integration/test_swarm_hung_worker.py wedges a real
worker's engine behind the gateway.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from meshnet.core.errors import DeadlineExceeded, Unavailable
from meshnet.core.events import RouteHop
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeCapability
from meshnet.core.step_budget import StepBudget
from meshnet.node.ring import MAX_CHUNKS_IN_FLIGHT
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


def run_on(session: RouteSession) -> RouteRun:
    return RouteRun(session, GenerationRequest((1, 2, 3), 4), None, None, None, BUDGET)  # type: ignore[arg-type]


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


def test_the_driver_allows_for_as_many_chunks_ahead_as_the_head_keeps_in_flight() -> None:
    assert CHUNKS_AHEAD == MAX_CHUNKS_IN_FLIGHT
