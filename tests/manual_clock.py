"""The clock a test moves by hand.

Components that age records (heartbeats, tickets, held KV, queued work) take their monotonic
clock as a callable, so a test ages them by setting ``now`` or calling ``advance`` instead of
sleeping: the same assertions hold on a loaded CI runner as on an idle one."""

from __future__ import annotations


class ManualClock:
    """Stands at ``now`` until the test moves it; called, it answers ``now``."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
