"""How a long-running server process paces Python's cyclic garbage collector.

Measured on a tracker holding 3,000 nodes (issue 36): with CPython's default thresholds
(700, 10, 10) a full collection ran every ~10 s and stopped the event loop for 200-275 ms each
time, which alone put every call's p99 past 200 ms (a load generator holding 3,000 simulated
nodes paused up to 520 ms the same way). A full collection walks every object the process
keeps (node records, latency rows, sticky sessions: over a million at 100 routes/s), and the
default ``threshold2`` lets one start after every ten middle collections once a quarter of that
heap is new. Reference counting frees all but cyclic garbage at once, so collecting cycles
less often costs only the memory of the cycles left meanwhile.

``pace_collector`` freezes what start-up built (it lives as long as the process: imports,
configuration) and asks for a full collection only after ``oldest`` middle collections, which
at a busy tracker's allocation rate is minutes apart instead of seconds: the same pause, a
hundredth as often.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass


@dataclass(frozen=True)
class CollectorPace:
    """``gc.set_threshold``'s three numbers (see the module docstring for the measurements)."""

    young: int = 2_000
    """Allocations (less frees) between two young collections (CPython: 700)."""
    middle: int = 20
    """Young collections between two middle ones (CPython: 10)."""
    oldest: int = 1_000
    """Middle collections before a full one may run (CPython: 10)."""


SERVER_PACE = CollectorPace()


def pace_collector(pace: CollectorPace = SERVER_PACE) -> None:
    """Freeze what exists now and pace later collections; call once, after start-up."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(pace.young, pace.middle, pace.oldest)
