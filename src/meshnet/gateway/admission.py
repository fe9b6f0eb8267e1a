"""Admission control: a fixed number of requests in flight, refusing the rest at once (H3).

Rejecting immediately with 503 + Retry-After, instead of queueing without bound, is what every
serving engine we model ourselves on does: a client can retry elsewhere or later, while a hidden
queue only turns overload into timeouts.
"""

from __future__ import annotations


class Lease:
    """One admitted request's slot; releasing twice is harmless (cleanup paths overlap)."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._admission._return_slot()


class Admission:
    """Counts requests in flight against a cap; owned by one event loop, so no lock."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._in_flight = 0
        self.admitted = 0
        self.rejected = 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def try_acquire(self) -> Lease | None:
        """A lease if a slot is free, else None (the caller answers 503)."""
        if self._in_flight >= self.capacity:
            self.rejected += 1
            return None
        self._in_flight += 1
        self.admitted += 1
        return Lease(self)

    def _return_slot(self) -> None:
        self._in_flight -= 1
