"""How a long-running server process paces Python's cyclic garbage collector.

Measured on a tracker holding 3,000 nodes (issue 36): with CPython's default thresholds
(700, 10, 10) a full collection ran every ~10 s and stopped the event loop for 200-275 ms each
time, which alone put every call's p99 past 200 ms (a load generator holding 3,000 simulated
nodes paused up to 520 ms the same way). A full collection walks every object the process
keeps (node records, latency rows, sticky sessions: over a million at 100 routes/s), and the
default ``threshold2`` lets one start after every ten middle collections once a quarter of that
heap is new. Reference counting frees all but cyclic garbage at once, so collecting cycles
less often costs only the memory of the cycles left meanwhile. ``pace_collector`` freezes what
start-up built (it lives as long as the process: imports, configuration) and asks for a full
collection only after ``oldest`` middle collections: the same pause, a hundredth as often.

Young collections need a pace of their own (task gc39, ``bench/results/tracker_scale/
gc39-evidence.md``). CPython starts one when allocations *less deallocations* of tracked
objects pass ``threshold0``, and deallocations of old objects count too. A busy tracker
replaces each node's view, load and entry at every heartbeat (1,500 a second): the old ones'
deaths cancel the new ones' births, so with a threshold of 2,000 the young generation held
72,000 objects by the time a collection started, about once a second, and walking them took
20-25 ms of CPU each time (30 ms on a shared core; 0.8 ms during a join, when nothing old
dies). That pause, once a second, was the ChooseRoute p99. A collection's cost is the young
objects it walks, and how many arrive per unit of threshold depends on the process's churn,
so ``YoungPacer`` measures each young collection's CPU time and halves ``threshold0`` while
one takes longer than ``young_pause_ms``, growing it back slowly while they are short: many
short pauses instead of few long ones, the same walking in all. The middle threshold moves
with it so that middle collections keep their pace (every ``middle_allocations`` net).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class CollectorPace:
    """``gc.set_threshold``'s three numbers and how the first one adapts (see the module docstring)."""

    young: int = 2_000
    """Allocations (less frees) between two young collections at start (CPython: 700)."""
    middle_allocations: int = 40_000
    """Allocations (less frees) between two middle collections: ``threshold1`` is this over the
    young threshold of the moment (CPython: 7,000)."""
    oldest: int = 1_000
    """Middle collections before a full one may run (CPython: 10)."""
    young_pause_ms: float = 2.0
    """CPU time a young collection may take before the young threshold is halved."""
    young_min: int = 50
    """The young threshold never falls below this: each collection has a fixed cost too."""
    young_max: int = 2_000
    """Nor grows above this, when young collections are short (a join, an idle process)."""

    @property
    def middle(self) -> int:
        """``threshold1`` at the starting young threshold."""
        return thresholds(self, self.young)[1]


SERVER_PACE = CollectorPace()


def thresholds(pace: CollectorPace, young: int) -> tuple[int, int, int]:
    """``gc.set_threshold``'s arguments for the young threshold ``young``."""
    return young, max(1, pace.middle_allocations // young), pace.oldest


def next_young_threshold(pace: CollectorPace, young: int, pause_ms: float) -> int:
    """The young threshold after a young collection that took ``pause_ms`` of CPU at ``young``.

    Halved while too long (a few collections reach the budget from any start); grown by an
    eighth while under half the budget, so that a process whose churn fell (an idle tracker)
    drifts back to fewer collections without swinging past the budget."""
    if pause_ms > pace.young_pause_ms:
        return max(pace.young_min, young // 2)
    if pause_ms < pace.young_pause_ms / 2:
        return min(pace.young_max, young + young // 8 + 1)
    return young


class YoungPacer:
    """A ``gc.callbacks`` hook: times each young collection and sets the thresholds it asks.

    Times CPU (``time.thread_time``), not wall time: a collection holds the GIL, and its wall
    time on a shared core measures the machine's load as much as the collection."""

    def __init__(
        self,
        pace: CollectorPace = SERVER_PACE,
        *,
        cpu_clock: Callable[[], float] = time.thread_time,
        set_threshold: Callable[[int, int, int], None] = gc.set_threshold,
    ) -> None:
        self.pace = pace
        self.young = pace.young
        self._cpu_clock = cpu_clock
        self._set_threshold = set_threshold
        self._started: float | None = None

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 0:
            return
        if phase == "start":
            self._started = self._cpu_clock()
            return
        if self._started is None:
            return
        pause_ms = (self._cpu_clock() - self._started) * 1000.0
        self._started = None
        young = next_young_threshold(self.pace, self.young, pause_ms)
        if young != self.young:
            self.young = young
            self._set_threshold(*thresholds(self.pace, young))


def pace_collector(pace: CollectorPace = SERVER_PACE) -> YoungPacer:
    """Freeze what exists now and pace later collections; call once, after start-up."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds(pace, pace.young))
    pacer = YoungPacer(pace)
    gc.callbacks.append(pacer)
    return pacer
