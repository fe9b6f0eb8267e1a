"""Batches on a pipelined route: a shard of a longer route runs every ready decode step at once
(work-conserving), while a shard that is a whole route by itself still waits briefly for the
steps its last batch answered; the expected-session count that sizes that wait.

``FakeBackend`` stands in for llama.cpp: it shows the loop's scheduling (chunks, batches,
deadlines, failures), not numerics or KV isolation; that a batch computes exactly what each step
computes alone is tests/unit/engine/test_engine_sessions.py, on real llama.cpp.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from meshnet.core.layers import LayerRange
from meshnet.engine.backend import StepInput
from meshnet.engine.fake_backend import FakeBackend
from meshnet.session.engine_loop import EngineLoop
from meshnet.session.scheduler import (
    GatherPolicy,
    expected_sessions,
    gather_wait,
    gathers,
    pipeline_waves,
    wave_size,
    window_length,
)

POLICY = GatherPolicy(window_s=0.002, max_window_s=0.010, horizon_s=0.5)
PATIENT = GatherPolicy(window_s=30.0, max_window_s=30.0, horizon_s=60.0)
"""A window far longer than any test: a shard that gathers at all would visibly hold a step."""


def test_only_a_whole_route_gathers() -> None:
    assert gathers(takes_tokens=True, emits_logits=True)  # full shard: its answers come back to it
    assert not gathers(takes_tokens=True, emits_logits=False)  # head of a longer route
    assert not gathers(takes_tokens=False, emits_logits=False)  # middle
    assert not gathers(takes_tokens=False, emits_logits=True)  # tail


def test_a_session_away_past_the_window_is_not_expected() -> None:
    # Slots 0 and 1 are ready; slot 2 steps every 40 ms and last came 5 ms ago, so it is due
    # 35 ms from now, long after a 10 ms window closes.
    last = {0: 10.0, 1: 10.0, 2: 9.995}
    period = {0: 0.040, 1: 0.040, 2: 0.040}
    assert expected_sessions(last, period, {0, 1}, until=10.010, now=10.0, policy=POLICY) == 2


def test_a_straggler_of_the_same_batch_is_expected() -> None:
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


def token(t: int) -> np.ndarray:
    return np.array([t], np.int32)


async def both_decode(engine: EngineLoop) -> None:
    """Slots 0 and 1 each run a step together, so the shard knows two decoding sessions."""
    fake = engine.backend
    assert isinstance(fake, FakeBackend)
    entered, release = threading.Event(), threading.Event()

    def hold(_: object) -> None:
        entered.set()
        release.wait(5.0)

    held = asyncio.ensure_future(engine.call(hold))
    assert await asyncio.to_thread(entered.wait, 5.0)
    steps = [asyncio.ensure_future(engine.run_step(StepInput(s, 0, tokens=token(3)))) for s in (0, 1)]
    await asyncio.sleep(0)  # both are in the inbox before the loop thread looks again
    release.set()
    await held
    await asyncio.gather(*steps)
    fake.calls.clear()


async def test_a_stage_of_a_longer_route_runs_a_ready_step_at_once() -> None:
    # A head whose sessions run on through later shards: slot 1's next step is on another shard,
    # so slot 0's step must not wait for it, however long the window could be.
    engine = EngineLoop(lambda: FakeBackend(LayerRange(0, 2), 6, n_embd=8, max_slots=8), gather=PATIENT)
    await asyncio.to_thread(engine.start)
    try:
        await both_decode(engine)
        await asyncio.wait_for(engine.run_step(StepInput(0, 1, tokens=token(4))), timeout=5.0)
        fake = engine.backend
        assert isinstance(fake, FakeBackend)
        assert fake.calls == [1]
    finally:
        await asyncio.to_thread(engine.stop)


async def test_a_whole_route_still_waits_for_the_steps_its_batch_answered() -> None:
    engine = EngineLoop(lambda: FakeBackend(LayerRange(0, 6), 6, n_embd=8, max_slots=8), gather=PATIENT)
    await asyncio.to_thread(engine.start)
    try:
        await both_decode(engine)
        first = asyncio.ensure_future(engine.run_step(StepInput(0, 1, tokens=token(4))))
        done, _ = await asyncio.wait({first}, timeout=0.3)
        assert not done  # held for slot 1, which this shard's own batch answered
        second = asyncio.ensure_future(engine.run_step(StepInput(1, 1, tokens=token(4))))
        await asyncio.wait_for(asyncio.gather(first, second), timeout=5.0)
        fake = engine.backend
        assert isinstance(fake, FakeBackend)
        assert fake.calls == [2]
    finally:
        await asyncio.to_thread(engine.stop)


def test_only_the_head_of_a_longer_route_splits_its_sessions_into_waves() -> None:
    def waves(takes_tokens: bool, emits_logits: bool) -> int:
        return pipeline_waves(takes_tokens=takes_tokens, emits_logits=emits_logits, route_shards=3)

    assert waves(True, False) == 3  # head of a longer route
    assert waves(True, True) == 1  # a whole route by itself
    assert waves(False, False) == 1  # middle: inherits the waves
    assert waves(False, True) == 1  # tail


def test_a_head_runs_one_wave_per_shard_of_its_longest_route() -> None:
    head = {n: pipeline_waves(takes_tokens=True, emits_logits=False, route_shards=n) for n in (1, 2, 3, 5)}
    # One shard known (no route told yet) is still a head with a shard after it: two waves.
    assert head == {1: 2, 2: 2, 3: 3, 5: 5}


def test_a_wave_is_a_third_of_the_decoding_sessions_or_one_session() -> None:
    # Oracle: the waves a three-shard route's head forms, written out by hand for each
    # concurrency: a third of the sessions (rounded up), unless that leaves fewer than three waves
    # (4 sessions: 2 + 2), then one session per wave.
    expected = {2: 1, 3: 1, 4: 1, 5: 2, 6: 2, 7: 3, 8: 3, 9: 3, 10: 4, 16: 6}
    assert {n: wave_size(64, n, 3) for n in expected} == expected
    assert wave_size(3, 16, 3) == 3  # the engine's own bound still holds
    assert wave_size(2, 16, 3) == 2  # ... eight waves of two
    assert wave_size(1, 16, 3) == 1
    assert wave_size(64, 1, 3) == 64  # a single stream is never held back
    assert wave_size(64, 0, 3) == 64  # nothing known to decode yet: nothing to split
    assert wave_size(64, 8, 1) == 64  # a shard without waves runs every ready step


def test_fewer_sessions_than_waves_make_one_wave_each_never_one_lockstep_wave() -> None:
    # Two sessions on a three-wave head: before, ``decoding_sessions < waves`` ran both in one
    # call, so the two shards took turns idling (the route moved in lock-step).
    assert wave_size(64, 2, 3) == 1
    assert wave_size(64, 2, 2) == 1


def test_two_row_waves_run_as_waves_where_they_give_every_shard_one() -> None:
    # Four sessions on a two-shard route: two waves of two (measured faster than four one-row
    # waves, bench/results/v5/waves45); three sessions: a wave of two and one of one.
    assert wave_size(64, 4, 2) == 2
    assert wave_size(64, 3, 2) == 2
    # On a three-shard route two waves of two would leave a shard idle: one-row waves instead.
    assert wave_size(64, 4, 3) == 1
    # Whatever the numbers, a head never makes fewer waves than it has shards to keep busy.
    for waves in range(2, 6):
        for sessions in range(2, 40):
            size = wave_size(64, sessions, waves)
            assert -(-sessions // size) >= min(waves, sessions)
