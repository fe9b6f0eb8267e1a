"""A pipelined route at concurrency: a head batches only its share of the sessions, and no
shard waits for a session whose step is on another shard of the ring."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from meshnet.core.layers import LayerRange
from meshnet.engine.backend import StepInput
from meshnet.engine.fake_backend import FakeBackend
from meshnet.session.engine_loop import EngineLoop
from meshnet.session.scheduler import GatherPolicy, expected_sessions, gather_wait, pipeline_batch, window_length

POLICY = GatherPolicy(window_s=0.002, max_window_s=0.010, horizon_s=0.5)


def test_a_head_batches_its_share_of_the_sessions() -> None:
    assert pipeline_batch(8, 2, 64) == 4
    assert pipeline_batch(8, 3, 64) == 3  # 3 + 3 + 2
    assert pipeline_batch(1, 3, 64) == 1
    assert pipeline_batch(0, 2, 64) == 1  # nothing decoding yet: a step still runs
    assert pipeline_batch(8, 1, 64) == 64  # not a pipelined route: no cap
    assert pipeline_batch(100, 2, 8) == 8  # never past the engine's own bound


def test_a_session_away_on_another_shard_is_not_expected() -> None:
    # Slots 0 and 1 are ready; slot 2 steps every 40 ms and last came 5 ms ago, so it is due
    # 35 ms from now, long after a 10 ms window closes: it is on the other shard.
    last = {0: 10.0, 1: 10.0, 2: 9.995}
    period = {0: 0.040, 1: 0.040, 2: 0.040}
    assert expected_sessions(last, period, {0, 1}, until=10.010, now=10.0, policy=POLICY) == 2


def test_a_straggler_of_the_same_group_is_expected() -> None:
    # Slot 2 last came 39 ms ago and steps every 40 ms: due within the window.
    last = {0: 10.0, 1: 10.0, 2: 9.961}
    period = {0: 0.040, 1: 0.040, 2: 0.040}
    assert expected_sessions(last, period, {0, 1}, until=10.010, now=10.0, policy=POLICY) == 3


def test_a_session_without_a_known_period_is_expected() -> None:
    # Its first steps: nothing says it is away, so the window waits for it as it always did.
    assert expected_sessions({0: 10.0, 1: 9.99}, {}, {0}, until=10.010, now=10.0, policy=POLICY) == 2


def test_a_session_idle_past_the_horizon_is_not_expected() -> None:
    assert expected_sessions({0: 10.0, 1: 9.0}, {}, {0}, until=10.010, now=10.0, policy=POLICY) == 1


def test_the_expected_count_drives_the_window() -> None:
    window = window_length(POLICY, 0.004)
    assert window == pytest.approx(0.004)

    # Two ready, two expected: run now. Two ready, three expected: wait out the window.
    def wait(expected: int) -> float:
        return gather_wait(
            [10.0, 10.0],
            expected,
            prefill_waiting=False,
            earliest_deadline=None,
            now=10.0,
            policy=POLICY,
            decode_call_s=0.004,
        )

    assert wait(2) == 0
    assert wait(3) == pytest.approx(0.004)


def backend() -> FakeBackend:
    return FakeBackend(LayerRange(0, 2), 6, n_embd=8, max_slots=8, max_batch_tokens=4)


async def decode_round(engine: EngineLoop, position: int, stages: int) -> list[int]:
    """One decode step of each of 6 sessions, queued while the loop thread is held so that they
    all reach one tick; the batch sizes the shard ran them in."""
    fake = engine.backend
    assert isinstance(fake, FakeBackend)
    entered, release = threading.Event(), threading.Event()

    def hold(_: object) -> None:
        entered.set()
        release.wait(5.0)

    held = asyncio.ensure_future(engine.call(hold))
    assert await asyncio.to_thread(entered.wait, 5.0)
    fake.calls.clear()
    steps = [
        asyncio.ensure_future(engine.run_step(StepInput(s, position, tokens=np.array([7], np.int32)), stages=stages))
        for s in range(6)
    ]
    await asyncio.sleep(0)  # every step is in the inbox
    release.set()
    await held
    await asyncio.gather(*steps)
    return list(fake.calls)


@pytest.mark.parametrize(("stages", "batches"), [(1, [6]), (2, [3, 3]), (3, [2, 2, 2])])
async def test_a_head_of_a_longer_route_runs_its_share_of_the_sessions(stages: int, batches: list[int]) -> None:
    engine = EngineLoop(backend)
    await asyncio.to_thread(engine.start)
    try:
        for position in range(3):  # the sessions decode, so each counts toward the share
            calls = await decode_round(engine, position, stages)
        assert calls == batches
    finally:
        await asyncio.to_thread(engine.stop)
