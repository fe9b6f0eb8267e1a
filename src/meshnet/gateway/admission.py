"""Admission control: a number of requests in flight, a bounded FIFO queue behind them.

Load that the swarm can absorb a little later is queued, as vLLM, llama-server and TGI do,
rather than refused: a refused client retries on its own schedule and usually at the same
moment as every other one. The queue is bounded and each place has a deadline, because an
unbounded queue only turns overload into timeouts; beyond the bound the answer is an immediate
503 whose ``Retry-After`` is drawn between the expected wait and twice it, so the clients it
turns away come back spread out instead of in one wave.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import deque
from collections.abc import Callable

THROUGHPUT_WINDOW_S = 60.0
"""Completions counted for the throughput behind the expected wait."""


class Refused(Exception):
    """No slot now and no place in the queue (or the place's deadline passed)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class Lease:
    """One admitted request's slot; releasing twice is harmless (cleanup paths overlap)."""

    def __init__(self, admission: Admission, waited_s: float, *, background: bool = False) -> None:
        self._admission = admission
        self._held = True
        self._background = background
        self.waited_s = waited_s
        """Seconds the request spent in the queue before it was admitted."""

    def release(self) -> None:
        if self._held:
            self._held = False
            self._admission._return_slot(completed=not self._background)


class Admission:
    """Slots and the queue for them; owned by one event loop, so no lock."""

    def __init__(
        self,
        capacity: int,
        queue_limit: int,
        *,
        clock: Callable[[], float],
        rng: random.Random,
        retry_after_floor: int = 1,
    ) -> None:
        self.capacity = capacity
        self.queue_limit = queue_limit
        self._clock = clock
        self._rng = rng
        self._floor = max(1, retry_after_floor)
        self._in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._spare_watchers: list[asyncio.Future[None]] = []
        self._completions: deque[float] = deque()
        self.admitted = 0
        self.rejected = 0
        self.timed_out = 0
        self.queued_total = 0
        self.waited_seconds_total = 0.0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def resize(self, capacity: int, queue_limit: int) -> None:
        """New limits (the swarm grew or shrank); requests already admitted keep their slots."""
        self.capacity, self.queue_limit = capacity, queue_limit
        self._grant_waiting()
        self._wake_spare_watchers()

    async def spare_slot(self) -> Lease:
        """A slot for background work (audit replays), taken only when no request waits for one.

        Background work holds a slot like a request, so the shards never see more sessions than
        the gateway admits; but it never overtakes the queue, and requests that arrive while it
        runs wait behind it instead of meeting a shard that is full.
        """
        while self._in_flight >= self.capacity or self._waiters:
            watcher = asyncio.get_running_loop().create_future()
            self._spare_watchers.append(watcher)
            try:
                await watcher
            finally:
                if watcher in self._spare_watchers:
                    self._spare_watchers.remove(watcher)
        self._in_flight += 1
        return Lease(self, 0.0, background=True)

    async def acquire(self, wait_s: float, on_queued: Callable[[int], None]) -> Lease:
        """A lease, at once or after waiting at most ``wait_s`` in the queue; ``Refused`` if not.

        ``on_queued(position)`` is called when the request has to wait (1: next in line).
        """
        if self._in_flight < self.capacity and not self._waiters:
            self._take()
            return Lease(self, 0.0)
        if len(self._waiters) >= self.queue_limit:
            self.rejected += 1
            raise Refused(self._full_message(), self.retry_after())
        queued_at = self._clock()
        place = asyncio.get_running_loop().create_future()
        self._waiters.append(place)
        self.queued_total += 1
        on_queued(len(self._waiters))
        try:
            async with asyncio.timeout(wait_s):
                await place
        except TimeoutError:
            if not self._granted(place):
                self._leave(place)
                self.timed_out += 1
                raise Refused(f"no slot freed within {wait_s:g} s in the queue", self.retry_after()) from None
        except asyncio.CancelledError:
            # The caller is gone. A slot granted in the same instant is handed on, not leaked.
            if self._granted(place):
                self._return_slot()
            else:
                self._leave(place)
            raise
        waited = self._clock() - queued_at
        self.waited_seconds_total += waited
        return Lease(self, waited)

    def retry_after(self) -> int:
        """Seconds to tell a refused client: the expected wait for a place, jittered up to twice it."""
        rate = self._throughput()
        expected = (len(self._waiters) + 1) / rate if rate > 0 else 0.0
        base = max(self._floor, math.ceil(expected))
        return base + self._rng.randint(0, base)

    def _throughput(self) -> float:
        """Completions per second over the recent window; 0 until two are seen."""
        now = self._clock()
        while self._completions and self._completions[0] < now - THROUGHPUT_WINDOW_S:
            self._completions.popleft()
        if len(self._completions) < 2:
            return 0.0
        span = max(now - self._completions[0], 1e-3)
        return len(self._completions) / span

    def _full_message(self) -> str:
        return (
            f"the gateway is at its limit of {self.capacity} requests in flight and "
            f"{self.queue_limit} waiting; retry later"
        )

    @staticmethod
    def _granted(place: asyncio.Future[None]) -> bool:
        return place.done() and not place.cancelled()

    def _leave(self, place: asyncio.Future[None]) -> None:
        place.cancel()
        if place in self._waiters:
            self._waiters.remove(place)

    def _take(self) -> None:
        self._in_flight += 1
        self.admitted += 1

    def _grant_waiting(self) -> None:
        # The slot goes straight to the head of the queue, so a newcomer cannot overtake it.
        while self._waiters and self._in_flight < self.capacity:
            place = self._waiters.popleft()
            if not place.done():
                self._take()
                place.set_result(None)

    def _return_slot(self, *, completed: bool = True) -> None:
        self._in_flight -= 1
        if completed:  # background work says nothing about how fast requests complete
            self._completions.append(self._clock())
        self._grant_waiting()
        self._wake_spare_watchers()

    def _wake_spare_watchers(self) -> None:
        watchers, self._spare_watchers = self._spare_watchers, []
        for watcher in watchers:
            if not watcher.done():
                watcher.set_result(None)
