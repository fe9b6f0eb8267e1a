"""The waits of ``membership.backoff``: bounded, centred on the tracker's pace, spread out.

Every schedule is drawn from seeded ``random.Random`` sources, so each run sees the same draws;
3,000 nodes stand for the issue's mass join (one seed per node, as each process has its own)."""

from __future__ import annotations

import random
import statistics

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.membership.backoff import BusyBackoff, RefusalBackoff, RejoinDelay

NODES = 3_000


def node_draws(seed: int = 36) -> list[random.Random]:
    return [random.Random(seed * 100_000 + node) for node in range(NODES)]


def test_a_busy_wait_lies_within_half_to_one_and_a_half_hints() -> None:
    busy = BusyBackoff()
    waits = [busy.wait_s(2.0, source.random) for source in node_draws()]
    assert min(waits) >= 1.0 and max(waits) <= 3.0
    assert statistics.mean(waits) == pytest.approx(2.0, rel=0.03)  # on average the tracker's pace


def test_the_busy_edges_are_the_draws_edges() -> None:
    busy = BusyBackoff()
    assert busy.wait_s(4.0, lambda: 0.0) == 2.0
    assert busy.wait_s(4.0, lambda: 0.5) == 4.0
    assert busy.wait_s(4.0, lambda: 0.999_999) == pytest.approx(6.0)


def test_nodes_shed_together_come_back_spread_over_the_whole_hint() -> None:
    busy = BusyBackoff()
    waits_ms = [int(busy.wait_s(1.0, source.random) * 1000) for source in node_draws()]
    per_ms = max(waits_ms.count(ms) for ms in set(waits_ms))
    # 3,000 nodes over 1,000 ms: about 3 a millisecond, never a crowd in one.
    assert len(set(waits_ms)) > 900 and per_ms <= 15


def test_a_hostile_or_negative_hint_is_bounded() -> None:
    busy = BusyBackoff(max_s=60.0)
    assert busy.wait_s(1e9, lambda: 0.999) <= 60.0
    assert busy.wait_s(-5.0, lambda: 0.5) == busy.min_s  # a negative hint is the floor's


def test_a_hint_at_the_cap_still_spreads_below_it() -> None:
    """Clipping after the jitter sent half the nodes back at exactly the cap, in step again."""
    busy = BusyBackoff(max_s=60.0)
    waits = [busy.wait_s(60.0, source.random) for source in node_draws()]
    assert max(waits) <= 60.0
    assert sum(wait == 60.0 for wait in waits) <= 1
    assert len({round(wait, 3) for wait in waits}) > 2_800  # 3,000 nodes over 40,000 ms, few together
    assert min(waits) == pytest.approx(20.0, abs=0.1)  # the hint held at 60/1.5, spread from 20 s


def test_a_zero_hint_is_no_tight_loop() -> None:
    busy = BusyBackoff()
    waits = [busy.wait_s(0.0, source.random) for source in node_draws()]
    assert min(waits) >= busy.min_s * (1 - busy.spread) > 0.0
    assert len({round(wait, 4) for wait in waits}) > 900  # spread, not all at the floor


def test_the_same_seed_gives_the_same_schedule() -> None:
    busy, rejoin = BusyBackoff(), RejoinDelay()
    first = [(busy.wait_s(1.0, s.random), rejoin.wait_s(2.0, s.random)) for s in node_draws(7)[:50]]
    again = [(busy.wait_s(1.0, s.random), rejoin.wait_s(2.0, s.random)) for s in node_draws(7)[:50]]
    other = [(busy.wait_s(1.0, s.random), rejoin.wait_s(2.0, s.random)) for s in node_draws(8)[:50]]
    assert first == again and first != other


def test_a_mass_rejoin_spreads_over_one_heartbeat_interval() -> None:
    rejoin = RejoinDelay()
    waits = [rejoin.wait_s(2.0, source.random) for source in node_draws()]
    assert min(waits) >= 0.0 and max(waits) < 2.0
    per_10ms = [0] * 200
    for wait in waits:
        per_10ms[int(wait * 100)] += 1
    # Uniform: about 15 registrations in each 10 ms, instead of 3,000 in the first one.
    assert max(per_10ms) <= 40 and min(per_10ms) >= 2


def test_a_rejoin_fraction_bounds_the_wait() -> None:
    assert RejoinDelay(fraction=0.25).wait_s(2.0, lambda: 0.999) < 0.5
    assert RejoinDelay(fraction=0.0).wait_s(2.0, lambda: 0.7) == 0.0


@pytest.mark.parametrize(
    "make",
    [
        lambda: BusyBackoff(spread=1.5),
        lambda: BusyBackoff(max_s=0),
        lambda: BusyBackoff(min_s=0),
        lambda: BusyBackoff(min_s=50.0, max_s=60.0),
        lambda: RejoinDelay(-0.1),
    ],
)
def test_bad_settings_are_refused(make: object) -> None:
    with pytest.raises(InvalidArgument):
        make()  # type: ignore[operator]


def test_refusals_double_up_to_the_cap() -> None:
    refusal = RefusalBackoff(max_beats=4.0)
    assert [refusal.wait_s(n, 1.0, lambda: 0.999_999) for n in (1, 2, 3, 4, 5)] == pytest.approx([1, 2, 4, 4, 4])
