"""The ring on a three-shard route wired as production wires it (``worker_shards``): a decode
token crosses N seams, prefill chunks pipeline with a bounded number in flight, a failed or
stalled hop ends the step at the head, and a frame off the ring after the opening one is refused.

The shards run ``FakeBackend`` (see ``worker_shards`` for what stands in for what): it shows the
protocol, not llama.cpp numerics or KV isolation, which tests/unit/engine/test_engine_sessions.py
and test_engine_split_exact.py show on real llama.cpp, and tests/model over real worker processes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import numpy as np
import pytest
from worker_shards import (
    CHUNK_TOKENS,
    FINGERPRINT,
    STEP_DEADLINE_MS,
    InProcessStream,
    Route,
    decode,
    on_ring,
    opening,
    reference_tokens,
    start_route,
)

from meshnet.core.errors import DeadlineExceeded, EngineError, InvalidArgument, MeshnetError, Unavailable
from meshnet.core.layers import LayerRange
from meshnet.node.ring import MAX_CHUNKS_IN_FLIGHT
from meshnet.wire.frames import Continuation, FrameMeta, StepFrame, StepResult

THREE = ((0, 2), (2, 4), (4, 6))
PROMPT = (3, 1, 4, 1, 5, 9, 2, 6, 5)
LONG_PROMPT = tuple((index * 7 + 3) % 64 for index in range(5 * CHUNK_TOKENS))
"""Five prefill chunks: the opening frame and four on the ring."""
FAILS_WITHIN_S = 1.0
"""A failed hop ends the step at the head well before the step's deadline."""
pytestmark = pytest.mark.timeout(30)  # a ring that loses an answer would hang its test

STALLED_DEADLINE_MS = 200
ENDS_AFTER_DEADLINE_S = 0.5
"""A stalled hop ends the head's step at its deadline, not much later."""


@pytest.fixture
async def route() -> AsyncIterator[Route]:
    started = await start_route(THREE)
    yield started
    await started.close()


def seam_messages(route: Route) -> int:
    return sum(shard.metrics().seam_messages for shard in route.shards)


def token(result: StepResult) -> int:
    if result.token_id is None:
        raise AssertionError(f"step {result.step} sampled nothing")
    return result.token_id


async def freed_everywhere(route: Route, sender: InProcessStream) -> None:
    """The sender's stream ended (as a route driver's does once its head fails the session):
    every shard has let the session go."""
    await asyncio.wait_for(reached(lambda: sender.ended), timeout=5.0)
    assert [shard.open_sessions for shard in route.shards] == [0, 0, 0]
    assert all(stream.ended for stream in route.streams)


async def test_a_decode_token_crosses_each_seam_once_round_the_ring(route: Route) -> None:
    sender = route.sender()
    first = opening(route, "s", PROMPT)
    result = await sender.exchange(first)
    # The opening frame goes down the chain and its answer back up it: 2(N-1) crossings.
    assert seam_messages(route) == 4
    tokens = [token(result)]
    for step in range(1, 7):
        result = await sender.exchange(decode(first, step=step, position=result.next_position, token=token(result)))
        tokens.append(token(result))
    assert tokens == reference_tokens(THREE, PROMPT, 7)
    # Each decode step: head -> middle -> tail, and the tail's answer straight to the head.
    assert seam_messages(route) == 4 + 3 * 6
    assert len(route.streams) == 2 and len(route.rings) == 1


async def test_the_head_decoding_by_itself_runs_on_the_ring(route: Route) -> None:
    sender = route.sender()
    await sender.send(opening(route, "s", PROMPT, continuation=Continuation(max_steps=5)))
    results = [await sender.read() for _ in range(6)]
    assert [r.token_id for r in results] == reference_tokens(THREE, PROMPT, 6)
    assert [r.step for r in results] == list(range(6))
    assert seam_messages(route) == 4 + 3 * 5
    assert len(route.rings) == 1


def chunks(first: StepFrame, deadline_ms: int | None) -> list[StepFrame]:
    """The prompt's chunks after the opening one, on the ring, as the route driver sends them."""
    starts = range(CHUNK_TOKENS, len(LONG_PROMPT), CHUNK_TOKENS)
    return [
        on_ring(
            first,
            LONG_PROMPT[start : start + CHUNK_TOKENS],
            step=index,
            position=start,
            phase="prefill",
            final_chunk=start + CHUNK_TOKENS >= len(LONG_PROMPT),
            deadline_ms=deadline_ms,
        )
        for index, start in enumerate(starts, start=1)
    ]


async def test_pipelined_prefill_chunks_give_the_whole_prompt_s_tokens(route: Route) -> None:
    sender = route.sender()
    first = opening(route, "p", LONG_PROMPT[:CHUNK_TOKENS], final_chunk=False)
    answers = [await sender.exchange(first)]
    answers += [await sender.exchange(chunk) for chunk in chunks(first, STEP_DEADLINE_MS)]
    # Only the final chunk samples; the head acknowledges the others once it has forwarded them.
    assert [a.token_id is None for a in answers] == [True, True, True, True, False]
    assert [a.next_position for a in answers] == [4, 8, 12, 16, 20]
    result = answers[-1]
    tokens = [token(result)]
    for step in range(5, 9):
        result = await sender.exchange(decode(first, step=step, position=result.next_position, token=token(result)))
        tokens.append(token(result))
    assert tokens == reference_tokens(THREE, LONG_PROMPT, 5)


async def test_at_most_two_prefill_chunks_are_unanswered_by_the_tail(route: Route) -> None:
    first = opening(route, "p", LONG_PROMPT[:CHUNK_TOKENS], final_chunk=False)
    await route.head.handle(first, None)
    route.backend(2).stall()
    ring_chunks = chunks(first, deadline_ms=STALLED_DEADLINE_MS)
    # With the tail stalled, the head still acknowledges the first chunks as it forwards them...
    for chunk in ring_chunks[:MAX_CHUNKS_IN_FLIGHT]:
        ack = await route.head.handle(chunk, None)
        assert (ack.step, ack.token_id) == (chunk.meta.step, None)
    # ... and the next waits for the tail's answer to the first of them, until its deadline.
    with pytest.raises(DeadlineExceeded, match="the tail's answer"):
        await route.head.handle(ring_chunks[MAX_CHUNKS_IN_FLIGHT], None)
    assert MAX_CHUNKS_IN_FLIGHT == 2


@pytest.mark.parametrize("victim", [1, 2], ids=["middle", "tail"])
async def test_a_failed_hop_ends_the_step_at_the_head_and_frees_the_session(route: Route, victim: int) -> None:
    sender = route.sender()
    first = opening(route, "s", PROMPT)
    opened = await sender.exchange(first)
    route.backend(victim).fail_with = RuntimeError(f"shard {victim} broke")
    step = decode(first, step=1, position=opened.next_position, token=token(opened), deadline_ms=STEP_DEADLINE_MS)
    began = time.monotonic()
    with pytest.raises(MeshnetError) as failure:
        await sender.exchange(step)
    assert time.monotonic() - began < FAILS_WITHIN_S, "the failure waited for the step's deadline"
    assert not isinstance(failure.value, DeadlineExceeded)
    if victim == 2:  # the tail tells the head why, on the ring
        assert isinstance(failure.value, EngineError) and "shard 2 broke" in failure.value.message
    else:  # the tail's ring or the head's watch on the middle ends: a retryable loss of the route
        assert failure.value.retryable, failure.value
    await freed_everywhere(route, sender)


async def test_a_link_lost_behind_the_middle_ends_the_step_the_head_waits_on(route: Route) -> None:
    # The tail never hears of the loss and keeps the session: only the middle's watch on its
    # downstream, and the head's on the middle, can end the head's wait for the tail's answer.
    first = opening(route, "s", PROMPT)
    opened = await route.head.handle(first, None)
    tail = route.backend(2)
    tail.stall()
    begun = tail.batches_begun
    step = decode(first, step=1, position=opened.next_position, token=token(opened), deadline_ms=STEP_DEADLINE_MS)
    waiting = asyncio.ensure_future(route.head.handle(step, None))
    await asyncio.wait_for(reached(lambda: tail.batches_begun > begun), timeout=5.0)
    lost = time.monotonic()
    route.streams[1].sever()  # middle -> tail
    with pytest.raises(Unavailable, match="connection to shard-2 was lost"):
        await waiting
    assert time.monotonic() - lost < FAILS_WITHIN_S, "the loss waited for the step's deadline"
    assert route.shards[1].open_sessions == 0  # the middle let the session go at once
    tail.running.set()


async def reached(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("victim", [1, 2], ids=["middle", "tail"])
async def test_a_stalled_hop_ends_the_step_at_its_deadline(route: Route, victim: int) -> None:
    first = opening(route, "s", PROMPT)
    opened = await route.head.handle(first, None)
    route.backend(victim).stall()
    step = decode(first, step=1, position=opened.next_position, token=token(opened), deadline_ms=STALLED_DEADLINE_MS)
    began = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        await asyncio.wait_for(route.head.handle(step, None), timeout=5.0)
    assert time.monotonic() - began < STALLED_DEADLINE_MS / 1000 + ENDS_AFTER_DEADLINE_S
    route.backend(victim).running.set()
    assert await route.head.end(first.meta.session_id, "the step failed")
    assert [shard.open_sessions for shard in route.shards] == [0, 0, 0]


async def test_a_frame_off_the_ring_after_the_opening_one_is_refused(route: Route) -> None:
    first = opening(route, "s", PROMPT)
    opened = await route.head.handle(first, None)
    ran = [list(route.backend(i).calls) for i in range(3)]
    on_the_chain = replace(decode(first, step=1, position=opened.next_position, token=token(opened)), ring=False)
    with pytest.raises(InvalidArgument, match="must be a ring frame"):
        await route.head.handle(on_the_chain, None)
    middle = FrameMeta(
        first.meta.request_id, first.meta.session_id, 0, FINGERPRINT, LayerRange(2, 4), "decode", 9, 1, "continue"
    )
    with pytest.raises(InvalidArgument, match="must be a ring frame"):
        await route.shards[1].handle(StepFrame(middle, hidden=np.ones((1, 16), np.float32)), None)
    assert [list(route.backend(i).calls) for i in range(3)] == ran  # nothing ran anywhere
    # Refused without harm: the session's next ring frame continues it exactly.
    step = decode(first, step=1, position=opened.next_position, token=token(opened))
    assert (await route.head.handle(step, None)).token_id == reference_tokens(THREE, PROMPT, 2)[1]


async def test_a_sender_s_frame_off_the_ring_fails_its_stream_and_frees_the_session(route: Route) -> None:
    sender = route.sender()
    first = opening(route, "s", PROMPT)
    opened = await sender.exchange(first)
    on_the_chain = replace(decode(first, step=1, position=opened.next_position, token=token(opened)), ring=False)
    with pytest.raises(InvalidArgument, match="must be a ring frame"):
        await sender.exchange(on_the_chain)
    await freed_everywhere(route, sender)
