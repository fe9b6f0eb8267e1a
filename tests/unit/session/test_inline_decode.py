"""Inline decode: a lone decode step runs on the caller's thread, anything that could batch
or must wait its turn goes through the engine thread as before.

Which thread runs what is shown on the fake backend (``ThreadRecorder``), whose arithmetic
cannot show numerics: that a step run inline gives the engine thread's output bit for bit is
shown on real llama.cpp shards of the tiny synthetic model.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.core.errors import DeadlineExceeded, EngineError
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import Backend, ShardShape, StepInput, StepOutput
from meshnet.engine.fake_backend import FakeBackend
from meshnet.session.engine_loop import EngineLoop

if TYPE_CHECKING:
    from meshnet.engine.llama_config import LlamaConfig
from meshnet.session.scheduler import INLINE_MAX_CALL_S, runs_inline

N_EMBD = 8


class ThreadRecorder(FakeBackend):
    """The fake backend, noting which thread ran each call."""

    def __init__(self, step_delay: float = 0.0) -> None:
        super().__init__(LayerRange(0, 2), 4, n_embd=N_EMBD, max_slots=4, max_batch_tokens=4, step_delay=step_delay)
        self.threads: list[int] = []

    def run(self, batch: list[StepInput]) -> list[StepOutput]:
        self.threads.append(threading.get_ident())
        return super().run(batch)


@pytest.fixture
async def engine() -> AsyncIterator[EngineLoop]:
    loop = EngineLoop(ThreadRecorder, inline_decode=True)
    await asyncio.to_thread(loop.start)
    yield loop
    await asyncio.to_thread(loop.stop)


def recorder(loop: EngineLoop) -> ThreadRecorder:
    backend = loop.backend
    if not isinstance(backend, ThreadRecorder):
        raise TypeError(f"expected the recording backend, got {backend!r}")
    return backend


def step(slot: int, position: int, *ids: int) -> StepInput:
    return StepInput(slot, position, tokens=np.array(ids, np.int32))


def test_only_a_lone_decode_step_of_the_only_decoding_session_runs_inline() -> None:
    assert runs_inline(1, queued=0, slot=2, sessions_seen=[])
    assert runs_inline(1, queued=0, slot=2, sessions_seen=[2])
    assert not runs_inline(4, queued=0, slot=2, sessions_seen=[])  # a prefill chunk
    assert not runs_inline(1, queued=1, slot=2, sessions_seen=[2])  # something waits its turn
    assert not runs_inline(1, queued=0, slot=2, sessions_seen=[2, 3])  # another session may batch


def test_a_slow_shard_keeps_its_steps_off_the_event_loop() -> None:
    assert runs_inline(1, queued=0, slot=0, sessions_seen=[0], decode_call_s=INLINE_MAX_CALL_S)
    assert not runs_inline(1, queued=0, slot=0, sessions_seen=[0], decode_call_s=2 * INLINE_MAX_CALL_S)


async def test_a_single_stream_decodes_on_the_callers_thread(engine: EngineLoop) -> None:
    caller = threading.get_ident()
    await engine.run_step(step(0, 0, 1, 2, 3))  # prefill: the engine thread
    for position in range(3, 6):
        await engine.run_step(step(0, position, 7))
    threads = recorder(engine).threads
    assert threads[0] != caller
    assert threads[1:] == [caller] * 3
    assert engine.stats.decode_steps == 3 and engine.stats.decode_batches == 3


async def test_a_second_decoding_session_sends_both_through_the_engine_thread(engine: EngineLoop) -> None:
    caller = threading.get_ident()
    await engine.run_step(step(0, 0, 1))  # inline: slot 0 is the only session
    await engine.run_step(step(1, 0, 2))  # slot 0 has decoded: slot 1 queues
    await engine.run_step(step(0, 1, 3))  # and so does slot 0 now
    assert recorder(engine).threads[0] == caller
    assert caller not in recorder(engine).threads[1:]
    await engine.truncate(1, 0)  # slot 1 released: slot 0 is alone again
    await engine.run_step(step(0, 2, 4))
    assert recorder(engine).threads[-1] == caller


class ThreadNoting:
    """Any backend, noting which thread ran each call (here: a real llama.cpp shard)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.threads: list[int] = []

    @property
    def shape(self) -> ShardShape:
        return self.backend.shape

    def run(self, batch: list[StepInput]) -> list[StepOutput]:
        self.threads.append(threading.get_ident())
        return self.backend.run(batch)

    def truncate(self, slot: int, position: int) -> None:
        self.backend.truncate(slot, position)

    def close(self) -> None:
        self.backend.close()


def noted(loop: EngineLoop) -> ThreadNoting:
    backend = loop.backend
    if not isinstance(backend, ThreadNoting):
        raise TypeError(f"expected the thread-noting backend, got {backend!r}")
    return backend


def emitted(output: StepOutput) -> bytes:
    """What the shard hands on (a head's hidden rows, a full model's logits), as raw bytes."""
    rows = output.hidden if output.hidden is not None else output.logits
    assert rows is not None and rows.dtype == np.float32
    return rows.tobytes()


@pytest.mark.parametrize("layers", [LayerRange(0, 2), LayerRange(0, 4)], ids=["head-hidden", "full-logits"])
async def test_inline_output_equals_the_engine_threads(
    layers: LayerRange, tiny_model: Path, small_llama_config: LlamaConfig, tmp_path: Path
) -> None:
    # The same llama.cpp shard, twice: one loop runs the lone decode steps on this thread, the
    # other on its engine thread. Their outputs must agree to the bit at every step.
    from meshnet.engine.shards import open_llama_shard

    source, cache = describe_model(tiny_model), SliceCache(tmp_path / "cache")

    def shard() -> Callable[[], Backend]:
        return lambda: ThreadNoting(open_llama_shard(source, layers, cache, small_llama_config))

    inline, queued = EngineLoop(shard(), inline_decode=True), EngineLoop(shard())
    await asyncio.to_thread(inline.start)
    await asyncio.to_thread(queued.start)
    try:
        caller = threading.get_ident()
        prompt = step(0, 0, 11, 12, 13, 14, 15)
        assert emitted(await inline.run_step(prompt)) == emitted(await queued.run_step(prompt))
        for position, token in enumerate((21, 7, 99, 3, 64), start=5):
            decode = step(0, position, token)
            assert emitted(await inline.run_step(decode)) == emitted(await queued.run_step(decode)), position
        assert noted(inline).threads[1:] == [caller] * 5  # the decode steps did run inline
        assert caller not in noted(queued).threads
    finally:
        await asyncio.to_thread(inline.stop)
        await asyncio.to_thread(queued.stop)


async def test_an_inline_step_past_its_deadline_fails_and_appends_nothing(engine: EngineLoop) -> None:
    await engine.run_step(step(0, 0, 1))
    with pytest.raises(DeadlineExceeded):
        await engine.run_step(step(0, 1, 2), deadline=0.0)
    assert engine.stats.expired == 1
    await engine.run_step(step(0, 1, 2))  # position 1 is still free


async def test_an_inline_engine_failure_is_typed_and_the_loop_serves_on(engine: EngineLoop) -> None:
    with pytest.raises(EngineError, match="engine failure"):
        # A hidden state into the head: the fake's arithmetic fails with a plain exception.
        await engine.run_step(StepInput(0, 0, hidden=np.zeros((1, N_EMBD + 1), np.float32)))
    output = await engine.run_step(step(0, 0, 1))
    assert output.hidden is not None and output.hidden.shape == (1, N_EMBD)


async def test_once_a_decode_call_is_slow_the_steps_leave_the_event_loop() -> None:
    loop = EngineLoop(lambda: ThreadRecorder(step_delay=2 * INLINE_MAX_CALL_S), inline_decode=True)
    await asyncio.to_thread(loop.start)
    try:
        caller = threading.get_ident()
        await loop.run_step(step(0, 0, 1))  # nothing known yet: inline
        await loop.run_step(step(0, 1, 2))  # known slow: the engine thread
        assert recorder(loop).threads[0] == caller and recorder(loop).threads[1] != caller
    finally:
        await asyncio.to_thread(loop.stop)


async def test_after_stop_no_step_runs_inline() -> None:
    loop = EngineLoop(ThreadRecorder, inline_decode=True)
    await asyncio.to_thread(loop.start)
    backend = recorder(loop)
    await asyncio.to_thread(loop.stop)
    calls = len(backend.threads)
    pending = asyncio.ensure_future(loop.run_step(step(0, 0, 1)))
    await asyncio.sleep(0.05)
    assert len(backend.threads) == calls  # never ran on the closed backend
    pending.cancel()
