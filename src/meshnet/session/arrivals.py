"""When each session's decode steps reach a shard: what the gather window and the inline step of
``session.scheduler`` decide from. Written only by the thread holding the engine loop's backend
lock."""

from __future__ import annotations

from collections.abc import Collection

from meshnet.session.scheduler import GatherPolicy, expected_sessions


class Arrivals:
    def __init__(self, policy: GatherPolicy) -> None:
        self._policy = policy
        self.last: dict[int, float] = {}
        """Slot -> arrival of its last decode step, until the slot is released."""
        self._period: dict[int, float] = {}
        """Slot -> moving average of the time between its decode steps' arrivals."""
        self._route_shards: dict[int, int] = {}
        """Slot -> shards of its session's route from this shard on (``StepInput.route_shards``)."""

    def note(self, slot: int, at: float, route_shards: int = 1) -> None:
        previous = self.last.get(slot)
        if previous is not None and at - previous <= self._policy.horizon_s:
            every = self._period.get(slot)
            self._period[slot] = at - previous if every is None else 0.7 * every + 0.3 * (at - previous)
        self.last[slot] = at
        self._route_shards[slot] = route_shards

    def release(self, slot: int) -> None:
        """The slot's session ended: no more steps to expect from it."""
        self.last.pop(slot, None)
        self._period.pop(slot, None)
        self._route_shards.pop(slot, None)

    def longest_route(self) -> int:
        """Shards of the longest route a decoding session here runs on, from this shard on."""
        return max(self._route_shards.values(), default=1)

    def expected(self, ready: Collection[int], *, until: float, now: float) -> int:
        return expected_sessions(self.last, self._period, ready, until=until, now=now, policy=self._policy)
