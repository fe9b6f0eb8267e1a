"""The engine loop over the fake backend: chunked prefill, batched decode, deadlines,
truncation, failures and shutdown, with the counters metrics read.

The loop thread drains its whole inbox before it plans a tick, so tests that need several
items in one tick hold the thread in a ``call`` (``Held``) while they queue them.

``FakeBackend`` stands in for llama.cpp: it shows the loop's scheduling (chunks, batches,
deadlines, failures), not numerics or KV isolation; that a batch computes exactly what each step
computes alone is tests/unit/engine/test_engine_sessions.py, on real llama.cpp.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest

from meshnet.core.errors import Cancelled, DeadlineExceeded, EngineError, InvalidArgument
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import Backend, StepInput
from meshnet.engine.bitwise import bit_identical
from meshnet.engine.fake_backend import FakeBackend
from meshnet.session.engine_loop import EngineLoop

CHUNK = 4
N_EMBD = 16


def head_backend(max_batch_tokens: int = CHUNK) -> FakeBackend:
    return FakeBackend(LayerRange(0, 2), 6, n_embd=N_EMBD, max_slots=4, max_batch_tokens=max_batch_tokens)


def tail_backend() -> FakeBackend:
    return FakeBackend(LayerRange(2, 6), 6, n_embd=N_EMBD, max_slots=4, max_batch_tokens=CHUNK)


def tokens(*ids: int) -> np.ndarray:
    return np.array(ids, np.int32)


@pytest.fixture
async def loop() -> AsyncIterator[EngineLoop]:
    engine = EngineLoop(head_backend)
    await asyncio.to_thread(engine.start)
    yield engine
    await asyncio.to_thread(engine.stop)


def fake(engine: EngineLoop) -> FakeBackend:
    backend = engine.backend
    if not isinstance(backend, FakeBackend):
        raise TypeError(f"expected the fake backend, got {backend!r}")
    return backend


class Held:
    """Keeps the loop thread inside a call until released, so queued work lands in one tick."""

    def __init__(self, engine: EngineLoop) -> None:
        self._engine = engine
        self._entered = threading.Event()
        self._release = threading.Event()
        self._call: asyncio.Future[None] | None = None

    async def __aenter__(self) -> Held:
        def hold(backend: Backend) -> None:
            self._entered.set()
            self._release.wait(5.0)

        self._call = asyncio.ensure_future(self._engine.call(hold))
        if not await asyncio.to_thread(self._entered.wait, 5.0):
            raise TimeoutError("the loop thread never picked up the call")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._release.set()
        if self._call is not None:
            await self._call


async def queued(*coroutines: object) -> list[asyncio.Task[object]]:
    tasks = [asyncio.ensure_future(c) for c in coroutines]  # type: ignore[call-overload]
    await asyncio.sleep(0)  # each task runs up to its await: its work is in the inbox
    return tasks


async def test_a_long_prefill_runs_in_aligned_chunks_and_equals_one_whole_run(loop: EngineLoop) -> None:
    prompt = tokens(*range(1, 11))  # 10 tokens at chunk 4: pieces 4 + 4 + 2
    output = await loop.run_step(StepInput(0, 0, tokens=prompt, want_logits="none"))
    assert fake(loop).calls == [1, 1, 1]
    reference = head_backend(max_batch_tokens=64).run([StepInput(0, 0, tokens=prompt)])[0]
    assert output.hidden is not None and reference.hidden is not None
    assert output.hidden.shape == (10, N_EMBD)
    assert output.hidden is not None and reference.hidden is not None
    assert bit_identical(output.hidden, reference.hidden)
    assert loop.stats.prefill_tokens == 10 and loop.stats.decode_steps == 0
    assert loop.stats.busy_seconds > 0


async def test_a_tail_prefill_returns_only_the_last_rows_logits() -> None:
    engine = EngineLoop(tail_backend)
    await asyncio.to_thread(engine.start)
    try:
        hidden = np.random.default_rng(1).standard_normal((9, N_EMBD)).astype(np.float32)
        output = await engine.run_step(StepInput(0, 0, hidden=hidden, want_logits="last"))
        assert output.logits is not None and output.logits.shape == (1, 64)
        whole = tail_backend().run([StepInput(0, 0, hidden=hidden, want_logits="last")])[0]
        assert output.logits is not None and whole.logits is not None
        assert bit_identical(output.logits, whole.logits)
    finally:
        await asyncio.to_thread(engine.stop)


async def test_decode_steps_of_several_sessions_share_one_call_with_one_prefill_chunk(loop: EngineLoop) -> None:
    for slot in range(3):
        await loop.run_step(StepInput(slot, 0, tokens=tokens(5 + slot)))
    backend = fake(loop)
    backend.calls.clear()
    async with Held(loop):
        tasks = await queued(
            *(loop.run_step(StepInput(slot, 1, tokens=tokens(9))) for slot in range(3)),
            loop.run_step(StepInput(3, 0, tokens=tokens(*range(1, 9)))),  # two chunks
        )
        assert loop.queue_depth == 4
    outputs = await asyncio.gather(*tasks)
    # A head (no route told yet: two shards, two waves) splits its three decoding sessions into a
    # wave of two and a wave of one (``scheduler.wave_size``): tick 1 runs the two steps and the
    # first prefill chunk, tick 2 the last step and the second chunk.
    assert backend.calls == [3, 2]
    assert [o.slot for o in outputs] == [0, 1, 2, 3]  # type: ignore[attr-defined]
    # The three one-token opening steps ran alone (a one-token step is a decode step to the
    # engine), then the three steps in two batches.
    assert loop.stats.decode_batches == 3 + 2 and loop.stats.decode_steps == 3 + 3
    assert loop.stats.prefill_tokens == 8
    assert loop.queue_depth == 0


async def test_a_step_past_its_deadline_fails_without_touching_the_kv(loop: EngineLoop) -> None:
    async with Held(loop):
        (late,) = await queued(loop.run_step(StepInput(0, 0, tokens=tokens(1, 2)), deadline=time.monotonic() + 0.01))
        await asyncio.sleep(0.05)
    with pytest.raises(DeadlineExceeded):
        await late
    assert loop.stats.expired == 1
    # Position 0 is still free: the expired step appended nothing.
    await loop.run_step(StepInput(0, 0, tokens=tokens(1, 2)))


async def test_truncation_cancels_queued_work_of_its_slot_only(loop: EngineLoop) -> None:
    async with Held(loop):
        doomed, spared, truncated = await queued(
            loop.run_step(StepInput(0, 0, tokens=tokens(1, 2))),
            loop.run_step(StepInput(1, 0, tokens=tokens(3, 4))),
            loop.truncate(0, 0),
        )
    with pytest.raises(Cancelled, match="released"):
        await doomed
    assert (await spared).slot == 1  # type: ignore[attr-defined]
    await truncated
    await loop.run_step(StepInput(0, 0, tokens=tokens(7)))  # slot 0 starts again at position 0


async def test_engine_errors_reach_their_caller_and_the_loop_keeps_serving(loop: EngineLoop) -> None:
    with pytest.raises(InvalidArgument, match="position 0, input starts at 5"):
        await loop.run_step(StepInput(0, 5, tokens=tokens(1)))
    with pytest.raises(EngineError, match="engine failure"):
        # A hidden state into the head: the fake's arithmetic fails with a plain exception.
        await loop.run_step(StepInput(1, 0, hidden=np.zeros((1, N_EMBD + 1), np.float32)))
    output = await loop.run_step(StepInput(0, 0, tokens=tokens(1)))
    assert output.hidden is not None and output.hidden.shape == (1, N_EMBD)


async def test_call_runs_on_the_loop_thread_and_returns_or_raises(loop: EngineLoop) -> None:
    caller = threading.get_ident()
    thread = await loop.call(lambda backend: threading.get_ident())
    assert thread != caller
    assert await loop.call(lambda backend: backend.shape.layers) == LayerRange(0, 2)

    def broken(backend: Backend) -> None:
        raise ValueError("broken probe")

    with pytest.raises(ValueError, match="broken probe"):
        await loop.call(broken)


async def test_stop_fails_work_still_queued() -> None:
    engine = EngineLoop(head_backend)
    await asyncio.to_thread(engine.start)
    async with Held(engine):
        (pending,) = await queued(engine.run_step(StepInput(0, 0, tokens=tokens(1, 2))))
        stopping = asyncio.ensure_future(asyncio.to_thread(engine.stop))
        await asyncio.sleep(0.05)
    await stopping
    with pytest.raises(Cancelled, match="shutting down"):
        await pending


async def test_a_backend_that_fails_to_open_fails_start() -> None:
    def refuse() -> Backend:
        raise InvalidArgument("no such model")

    engine = EngineLoop(refuse)
    with pytest.raises(InvalidArgument, match="no such model"):
        await asyncio.to_thread(engine.start)
    with pytest.raises(EngineError, match="not started"):
        _ = engine.backend


@pytest.mark.parametrize(("route_shards", "calls"), [(2, [4, 4]), (3, [3, 3, 2])])
async def test_a_head_cuts_its_decoding_sessions_into_one_wave_per_shard_of_their_route(
    route_shards: int, calls: list[int]
) -> None:
    engine = EngineLoop(lambda: FakeBackend(LayerRange(0, 2), 6, n_embd=N_EMBD, max_slots=8, max_batch_tokens=CHUNK))
    await asyncio.to_thread(engine.start)
    try:
        for slot in range(8):
            await engine.run_step(StepInput(slot, 0, tokens=tokens(5), route_shards=route_shards))
        backend = fake(engine)
        backend.calls.clear()
        async with Held(engine):
            tasks = await queued(
                *(engine.run_step(StepInput(slot, 1, tokens=tokens(9), route_shards=route_shards)) for slot in range(8))
            )
        await asyncio.gather(*tasks)
        # Eight sessions of a two-shard route: two waves of four neighbouring slots, one a shard;
        # of a three-shard route: three waves (a third each, rounded up).
        assert backend.calls == calls
    finally:
        await asyncio.to_thread(engine.stop)
