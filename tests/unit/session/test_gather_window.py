"""The gather window: a tick waits briefly for the steps of other decoding sessions, never for
a single stream, a waiting prefill chunk, past the window or past a deadline."""

from __future__ import annotations

import pytest

from meshnet.session.scheduler import GatherPolicy, gather_wait, nothing_to_gather

POLICY = GatherPolicy(window_s=0.002, horizon_s=0.5)


def wait(arrivals: list[float], sessions: int, *, prefill: bool = False, deadline: float | None = None) -> float:
    return gather_wait(arrivals, sessions, prefill_waiting=prefill, earliest_deadline=deadline, now=10.0, policy=POLICY)


def test_a_single_stream_never_waits() -> None:
    assert wait([10.0], 1) == 0.0


def test_a_single_stream_skips_the_window_altogether() -> None:
    assert nothing_to_gather(1, 1)
    assert nothing_to_gather(0, 3)  # nothing pending
    assert nothing_to_gather(1, 0)  # a prefill chunk of a session that has not decoded yet
    assert not nothing_to_gather(2, 1)
    assert not nothing_to_gather(1, 2)  # another session may still send its step


def test_the_shortcut_agrees_with_the_window() -> None:
    # Wherever the shortcut applies, the full computation would not wait either.
    for arrivals in ([], [10.0]):
        for sessions in (0, 1):
            if nothing_to_gather(len(arrivals), sessions):
                assert wait(arrivals, sessions) == 0.0
                assert wait(arrivals, sessions, prefill=not arrivals) == 0.0


def test_a_partial_batch_waits_out_the_rest_of_the_window() -> None:
    assert wait([9.9995, 10.0], 8) == pytest.approx(0.0015)


def test_a_full_batch_runs_at_once() -> None:
    assert wait([10.0] * 8, 8) == 0.0


def test_the_window_counts_from_the_oldest_step() -> None:
    assert wait([9.997, 10.0], 8) == 0.0


def test_a_waiting_prefill_chunk_is_never_held() -> None:
    assert wait([10.0], 8, prefill=True) == 0.0


def test_no_wait_past_a_deadline() -> None:
    assert wait([10.0], 8, deadline=10.0005) == pytest.approx(0.0005)
    assert wait([10.0], 8, deadline=9.0) == 0.0


def test_nothing_to_gather_without_decode_steps() -> None:
    assert wait([], 8) == 0.0


def test_the_window_stretches_to_one_decode_call_within_its_bound() -> None:
    def window(call_s: float) -> float:
        return gather_wait(
            [10.0], 8, prefill_waiting=False, earliest_deadline=None, now=10.0, policy=POLICY, decode_call_s=call_s
        )

    assert window(0.004) == pytest.approx(0.004)
    assert window(0.5) == pytest.approx(POLICY.max_window_s)
    assert window(0.0001) == pytest.approx(POLICY.window_s)
