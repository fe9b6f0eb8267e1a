"""``HopProgress``: which hops answered a step since a given one was sent, on a hand-wound clock."""

from __future__ import annotations

from manual_clock import ManualClock

from meshnet.route.hop_progress import HopProgress


def test_every_hop_must_have_answered_after_the_step_was_sent_and_within_the_window() -> None:
    clock = ManualClock(100.0)
    progress = HopProgress(clock)
    progress.answered(["head", "tail"])
    sent = clock.now
    clock.now += 1.0
    assert not progress.moving(["head", "tail"], since=sent, window_s=5.0), "answers before the step prove nothing"
    progress.answered(["head", "tail"])
    assert progress.moving(["head", "tail"], since=sent, window_s=5.0)
    clock.now += 5.5
    assert not progress.moving(["head", "tail"], since=sent, window_s=5.0), "an answer older than the window"


def test_a_hop_that_answered_nothing_stops_the_route_moving() -> None:
    clock = ManualClock(100.0)
    progress = HopProgress(clock)
    sent = clock.now
    clock.now += 1.0
    progress.answered(["head", "middle"])  # another route through the head, not through the tail
    assert progress.moving(["head", "middle"], since=sent, window_s=5.0)
    assert not progress.moving(["head", "tail"], since=sent, window_s=5.0)


def test_the_least_recently_answering_hops_are_forgotten_past_capacity() -> None:
    clock = ManualClock(100.0)
    progress = HopProgress(clock, capacity=2)
    for address in ("a", "b", "c"):
        clock.now += 1.0
        progress.answered([address])
    assert not progress.moving(["a"], since=0.0, window_s=10.0)
    assert progress.moving(["b", "c"], since=0.0, window_s=10.0)
    progress.answered(["b"])  # b answers again: c is now the oldest
    progress.answered(["d"])
    assert progress.moving(["b", "d"], since=0.0, window_s=10.0)
    assert not progress.moving(["c"], since=0.0, window_s=10.0)
