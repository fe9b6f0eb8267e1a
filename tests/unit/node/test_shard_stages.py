"""Each shard stage driven through real shards on fake backends, wired as production wires them
(``worker_shards``): opening, decode on the ring, idempotent repeats, refusals, teardown down the
route, and the head's own decode loop.

The shards run ``FakeBackend`` (see ``worker_shards`` for what stands in for what): it shows the
protocol, not llama.cpp numerics or KV isolation, which tests/unit/engine/test_engine_sessions.py
and test_engine_split_exact.py show on real llama.cpp, and tests/model over real worker processes.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import cast

import numpy as np
import pytest
from manual_clock import ManualClock
from worker_shards import (
    FINGERPRINT,
    Backend,
    Route,
    admission_policy,
    decode,
    opening,
    reference_tokens,
    start_route,
)

from meshnet.core.errors import (
    CacheMiss,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    RouteStale,
    Unavailable,
)
from meshnet.core.generation import SamplingParams
from meshnet.core.ids import RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.sampling_options import LogprobRequest, OutputConstraint
from meshnet.wire.frames import Continuation, FrameMeta, HopSpec, StepFrame, StepResult

THREE = ((0, 2), (2, 4), (4, 6))
GREEDY = SamplingParams()
PROMPT = (3, 1, 4, 1, 5, 9, 2, 6, 5)  # 9 tokens: prefill chunks of 4 + 4 + 1 on every shard


@pytest.fixture
async def route() -> AsyncIterator[Route]:
    started = await start_route(THREE)
    yield started
    await started.close()


async def drive(route: Route, session: str, prompt: tuple[int, ...], max_tokens: int) -> list[StepResult]:
    """Prefill, then decode step by step on the ring as a sender would, feeding each token back in."""
    first = opening(route, session, prompt)
    results = [await route.head.handle(first, None)]
    for step in range(1, max_tokens):
        last = results[-1]
        assert last.token_id is not None
        frame = decode(first, step=step, position=last.next_position, token=last.token_id)
        results.append(await route.head.handle(frame, None))
    return results


async def test_a_three_shard_route_generates_what_the_chained_backends_do(route: Route) -> None:
    backends = [cast(Backend, loop.backend) for loop in route.loops]
    for backend in backends:
        backend.route_shards.clear()  # the shards' start-up timing steps belong to no route
    results = await drive(route, "s", PROMPT, 6)
    assert [r.token_id for r in results] == reference_tokens(THREE, PROMPT, 6)
    assert [r.next_position for r in results] == [len(PROMPT) + i for i in range(6)]
    assert [r.step for r in results] == list(range(6))
    # Nobody asked for per-hop timings: none are measured or sent.
    assert all(r.timings == () for r in results)
    # A probe asks: every shard reports its own timing, in route order.
    last = results[-1]
    assert last.token_id is not None
    step = decode(opening(route, "s", PROMPT), step=6, position=last.next_position, token=last.token_id)
    probed = await route.head.handle(replace(step, want_timings=True), None)
    assert [t.layers for t in probed.timings] == [LayerRange(*r) for r in THREE]
    assert [s.open_sessions for s in route.shards] == [1, 1, 1]
    assert len(route.streams) == 2  # head -> middle, middle -> tail: one stream per seam
    assert len(route.rings) == 1  # and the tail's answers straight back to the head
    # Every step told its engine how many shards the route has from there on: the head cuts its
    # decoding sessions into that many waves (``scheduler.pipeline_waves``).
    assert [set(backend.route_shards) for backend in backends] == [{3}, {2}, {1}]


async def test_a_whole_model_shard_samples_and_decodes_on_alone() -> None:
    route = await start_route(((0, 6),))
    try:
        frame = opening(route, "s", PROMPT, continuation=Continuation(max_steps=4))
        first = await route.head.handle(frame, None)
        continued = [r async for r in route.head.continue_decoding(frame, first, None)]
        tokens = [first.token_id, *(r.token_id for r in continued)]
        assert tokens == reference_tokens(((0, 6),), PROMPT, 5)
        assert route.streams == [] and route.rings == []
    finally:
        await route.close()


async def test_a_repeated_step_is_answered_again_without_running(route: Route) -> None:
    first = opening(route, "s", PROMPT)
    opened = await route.head.handle(first, None)
    assert opened.token_id is not None
    step1 = decode(first, step=1, position=opened.next_position, token=opened.token_id)
    answer = await route.head.handle(step1, None)
    calls = [list(route.backend(i).calls) for i in range(3)]
    assert await route.head.handle(step1, None) is answer
    with pytest.raises(FailedPrecondition, match="out of order"):
        await route.head.handle(first, None)  # only the last step is kept for repeats
    assert [list(route.backend(i).calls) for i in range(3)] == calls  # nothing ran again
    # The session carries on from where the repeated step left it.
    assert answer.token_id is not None
    step2 = decode(first, step=2, position=answer.next_position, token=answer.token_id)
    assert (await route.head.handle(step2, None)).token_id == reference_tokens(THREE, PROMPT, 3)[2]


async def test_the_opening_frame_repeated_is_its_own_answer(route: Route) -> None:
    first = opening(route, "s", PROMPT)
    opened = await route.head.handle(first, None)
    assert await route.head.handle(first, None) is opened
    assert route.head.open_sessions == 1


async def test_a_position_gap_a_skipped_step_and_a_foreign_epoch_are_refused(route: Route) -> None:
    first = opening(route, "s", PROMPT, epoch=2)
    opened = await route.head.handle(first, None)
    assert opened.token_id is not None
    with pytest.raises(FailedPrecondition, match="does not continue"):
        await route.head.handle(decode(first, step=1, position=opened.next_position + 1, token=1), None)
    with pytest.raises(FailedPrecondition, match="out of order"):
        await route.head.handle(decode(first, step=3, position=opened.next_position, token=1), None)
    with pytest.raises(RouteStale):
        await route.head.handle(decode(first, step=1, position=opened.next_position, token=1, epoch=3), None)
    # None of them touched the KV: the right next step still gives the reference token.
    ok = await route.head.handle(decode(first, step=1, position=opened.next_position, token=opened.token_id), None)
    assert ok.token_id == reference_tokens(THREE, PROMPT, 2)[1]


async def test_frames_for_another_recipe_or_range_or_an_unknown_session_are_refused(route: Route) -> None:
    first = opening(route, "s", PROMPT)
    meta = first.meta
    foreign = FrameMeta(meta.request_id, meta.session_id, 0, "other", meta.layers, "prefill", 0, 0, "new")
    with pytest.raises(FailedPrecondition, match="recipe other"):
        await route.head.handle(StepFrame(foreign, tokens=first.tokens, downstream=()), None)
    with pytest.raises(FailedPrecondition, match="this shard runs 2:4"):
        await route.shards[1].handle(StepFrame(meta, tokens=first.tokens, downstream=route.hops()), None)
    with pytest.raises(CacheMiss, match="unknown"):
        await route.head.handle(decode(first, step=1, position=len(PROMPT), token=1), None)
    assert [s.open_sessions for s in route.shards] == [0, 0, 0]


async def test_each_output_stage_insists_on_what_its_sessions_need(route: Route) -> None:
    first = opening(route, "s", PROMPT)
    with pytest.raises(InvalidArgument, match="needs the downstream hops"):
        await route.head.handle(StepFrame(first.meta, tokens=first.tokens, sampling=first.sampling), None)
    short = (HopSpec("shard-1", LayerRange(2, 4), FINGERPRINT),)
    with pytest.raises(InvalidArgument, match="end at layer 4, not at the model's 6"):
        await route.head.handle(StepFrame(first.meta, tokens=first.tokens, downstream=short), None)
    opened = await route.head.handle(first, None)
    step1 = decode(first, step=1, position=opened.next_position, token=1)
    with pytest.raises(InvalidArgument, match="only in the opening frame"):
        await route.head.handle(StepFrame(step1.meta, tokens=step1.tokens, downstream=route.hops(), ring=True), None)
    tail = route.shards[2]
    with pytest.raises(InvalidArgument, match="sampling parameters for the tail"):
        await tail.handle(tail_opening(route, "t", sampling=None), None)
    beyond = (HopSpec("elsewhere", LayerRange(6, 7), FINGERPRINT),)
    with pytest.raises(InvalidArgument, match="only in the opening frame of a non-tail shard"):
        await tail.handle(tail_opening(route, "t", downstream=beyond), None)
    assert [s.open_sessions for s in route.shards] == [1, 1, 1]  # only the route's own session


def tail_opening(
    route: Route, session: str, *, sampling: SamplingParams | None = GREEDY, downstream: tuple[HopSpec, ...] = ()
) -> StepFrame:
    """The opening frame the middle forwards to the tail, with the route's ticket."""
    meta = FrameMeta(RequestId("r"), SessionId(session), 0, FINGERPRINT, LayerRange(4, 6), "prefill", 0, 0, "new")
    hidden = np.zeros((1, 16), np.float32)
    return StepFrame(meta, hidden=hidden, sampling=sampling, downstream=downstream, ticket=route.ticket(session))


async def test_the_head_loop_stops_at_max_steps(route: Route) -> None:
    frame = opening(route, "s", PROMPT, continuation=Continuation(max_steps=5))
    first = await route.head.handle(frame, None)
    continued = [r async for r in route.head.continue_decoding(frame, first, None)]
    assert [first.token_id, *(r.token_id for r in continued)] == reference_tokens(THREE, PROMPT, 6)
    assert [r.step for r in continued] == [1, 2, 3, 4, 5]
    # A sender may take over from the loop: the next step is an ordinary decode frame.
    last = continued[-1]
    assert last.token_id is not None
    after = await route.head.handle(decode(frame, step=6, position=last.next_position, token=last.token_id), None)
    assert after.token_id == reference_tokens(THREE, PROMPT, 7)[6]


async def test_the_head_loop_stops_after_a_stop_token(route: Route) -> None:
    expected = reference_tokens(THREE, PROMPT, 8)
    stop = expected[3]
    upto = expected.index(stop)
    frame = opening(route, "s", PROMPT, continuation=Continuation(max_steps=20, stop_token_ids=frozenset({stop})))
    first = await route.head.handle(frame, None)
    continued = [r async for r in route.head.continue_decoding(frame, first, None)]
    assert [first.token_id, *(r.token_id for r in continued)] == expected[: upto + 1]


async def test_the_head_loop_ends_at_the_stream_deadline(route: Route) -> None:
    frame = opening(route, "s", PROMPT, continuation=Continuation(max_steps=5))
    first = await route.head.handle(frame, None)
    with pytest.raises(DeadlineExceeded, match="while decoding"):
        async for _ in route.head.continue_decoding(frame, first, time.monotonic() - 1.0):
            pass


async def test_ending_a_session_at_the_head_frees_it_on_every_shard(route: Route) -> None:
    await drive(route, "s", PROMPT, 3)
    assert await route.head.end(SessionId("s"), "cancelled") is True
    assert await route.head.end(SessionId("s"), "cancelled") is False
    assert [s.open_sessions for s in route.shards] == [0, 0, 0]
    assert len(route.streams) == 2 and all(stream.ended for stream in route.streams)
    # The KV is gone too: the same session id starts again from position 0 on the same slots.
    results = await drive(route, "s", PROMPT, 2)
    assert [r.token_id for r in results] == reference_tokens(THREE, PROMPT, 2)


async def test_a_failed_opening_frame_leaves_no_session_behind() -> None:
    route = await start_route(THREE, policy=admission_policy(1, evict_idle_after=600.0))
    try:
        await route.shards[2].handle(tail_opening(route, "other"), None)  # the tail is now full
        # Head and middle admit "b", the tail refuses it: head and middle must let it go again.
        with pytest.raises(ResourceExhausted):
            await route.head.handle(opening(route, "b", PROMPT), None)
        assert [s.open_sessions for s in route.shards] == [0, 0, 1]
        assert len(route.streams) == 2 and all(stream.ended for stream in route.streams)
        with pytest.raises(CacheMiss, match="opening frame failed"):
            await route.head.handle(decode(opening(route, "b", PROMPT), step=1, position=9, token=1), None)
    finally:
        await route.close()


async def test_a_draining_shard_refuses_new_sessions_but_serves_open_ones(route: Route) -> None:
    first = opening(route, "s", PROMPT)
    opened = await route.head.handle(first, None)
    route.head.start_draining()
    with pytest.raises(Unavailable, match="draining"):
        await route.head.handle(opening(route, "t", PROMPT), None)
    assert opened.token_id is not None
    await route.head.handle(decode(first, step=1, position=opened.next_position, token=opened.token_id), None)
    assert route.head.capability().free_sessions == 0


async def test_idle_sessions_expire_after_their_ttl() -> None:
    clock = ManualClock()
    route = await start_route(((0, 6),), policy=admission_policy(2, ttl=60.0), clock=clock)
    try:
        await route.head.handle(opening(route, "old", PROMPT), None)
        clock.now = 30.0
        await route.head.handle(opening(route, "new", PROMPT), None)
        clock.now = 61.0
        assert await route.head.expire_idle() == 1
        with pytest.raises(CacheMiss, match="expired"):
            await route.head.handle(decode(opening(route, "old", PROMPT), step=1, position=9, token=1), None)
        assert route.head.open_sessions == 1
    finally:
        await route.close()


async def test_a_tail_without_a_vocabulary_refuses_grammar_sessions(route: Route) -> None:
    tail = route.shards[2]
    constrained = SamplingParams(constraint=OutputConstraint('root ::= "{}"'))
    with pytest.raises(InvalidArgument, match="no vocabulary to apply a grammar"):
        await tail.handle(tail_opening(route, "g", sampling=constrained), None)
    assert tail.open_sessions == 0


async def test_the_tail_reports_logprobs_only_when_asked(route: Route) -> None:
    tail = route.shards[2]
    plain = await tail.handle(tail_opening(route, "p"), None)
    asked = await tail.handle(tail_opening(route, "q", sampling=SamplingParams(logprobs=LogprobRequest(2))), None)
    assert plain.logprobs is None
    assert asked.logprobs is not None and asked.token_id == plain.token_id
    assert asked.logprobs.chosen.token_id == asked.token_id and len(asked.logprobs.top) == 2
