"""``pace_collector`` freezes start-up's objects, spaces full collections out and paces young
ones by the CPU time each takes (``YoungPacer``).

The whole-process settings are checked in a child interpreter; the pace decision and the hook
with a fake CPU clock, against numbers worked out by hand."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from meshnet.process.collector import SERVER_PACE, CollectorPace, YoungPacer, next_young_threshold, thresholds

PROBE = """
import gc, json
from meshnet.process.collector import YoungPacer, pace_collector
before = gc.get_threshold()
pacer = pace_collector()
print(json.dumps({
    "before": before,
    "after": gc.get_threshold(),
    "frozen": gc.get_freeze_count(),
    "hooked": sum(callback is pacer for callback in gc.callbacks),
}))
"""

PACE = CollectorPace(
    young=1_000, middle_allocations=40_000, oldest=500, young_pause_ms=2.0, young_min=50, young_max=2_000
)


def test_the_collector_is_paced_and_start_up_frozen() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    seen = json.loads(done.stdout)
    assert seen["before"] != seen["after"]
    assert tuple(seen["after"]) == (2_000, 20, 1_000) == (SERVER_PACE.young, SERVER_PACE.middle, SERVER_PACE.oldest)
    assert seen["frozen"] > 1000  # the imports at least
    assert seen["hooked"] == 1


def test_middle_collections_keep_their_pace_whatever_the_young_threshold() -> None:
    assert thresholds(PACE, 1_000) == (1_000, 40, 500)
    assert thresholds(PACE, 125) == (125, 320, 500)
    assert thresholds(CollectorPace(middle_allocations=10), 50) == (50, 1, 1_000)  # never 0: that disables them


@pytest.mark.parametrize(
    ("young", "pause_ms", "expected"),
    [
        (1_000, 24.0, 500),  # too long: halved
        (80, 3.0, 50),  # halved, but not below the floor
        (50, 9.0, 50),
        (1_000, 2.0, 1_000),  # within the budget's upper half: kept
        (1_000, 1.0, 1_000),
        (1_000, 0.5, 1_126),  # short: an eighth more, plus one
        (1_990, 0.1, 2_000),  # capped
    ],
)
def test_the_young_threshold_follows_the_pause(young: int, pause_ms: float, expected: int) -> None:
    assert next_young_threshold(PACE, young, pause_ms) == expected


def test_the_pacer_times_young_collections_only_and_sets_what_it_decides() -> None:
    now = [0.0]
    set_to: list[tuple[int, int, int]] = []
    pacer = YoungPacer(PACE, cpu_clock=lambda: now[0], set_threshold=lambda *three: set_to.append(three))

    def collect(generation: int, cpu_s: float) -> None:
        pacer("start", {"generation": generation, "collected": 0, "uncollectable": 0})
        now[0] += cpu_s
        pacer("stop", {"generation": generation, "collected": 0, "uncollectable": 0})

    collect(0, 0.024)  # 24 ms: halve
    collect(1, 0.500)  # a middle collection is not the young pacer's business
    collect(0, 0.0015)  # within budget: nothing to set
    collect(0, 0.010)
    pacer("stop", {"generation": 0, "collected": 0, "uncollectable": 0})  # a stop without a start
    assert set_to == [(500, 80, 500), (250, 160, 500)]
    assert pacer.young == 250
