"""When the tracker could last have heard each node, and who has been silent too long.

A node expires after ``expire_after_s`` of silence, but not for time the tracker itself could
not listen: its event loop stalled, or so far behind that a heartbeat that arrived waited in a
queue. Without that, a tracker behind on its work (a mass join after a restart, a burst of
routes) expires the very nodes whose heartbeats it has not got round to reading; they all
register again, adding to the load that made it late: the collapse issue 36 measured.

``Hearing`` measures that deafness and turns it into a grace added to the window:

- the loop's lateness: a watcher task (``watch_loop``, nothing else in it, so it keeps watching
  while the sweeper waits on the store) says when it expects to run next (``expect``) and
  reports when it did (``woke``). While it is overdue, the overdue part counts already, so a
  handler that runs first after a stall does not expire anyone for it. Each lateness counts in
  full for one window after the watcher woke from it: the nodes' heartbeats that queued during
  the stall are read in that window;
- strain (``strain``): time while admission sheds registrations or the store's queue is behind.
  Calls waiting inside gRPC's own queues are invisible to the loop's watcher (short handlers keep
  the loop punctual while calls wait seconds), so this is the fallback signal: strained spans
  count like lateness, in full for one window after they end, but at most one window in all,
  so a tracker strained for good still expires a dead node.

A node expires once ``now - heard >= window + grace``: the grace is the same for every node, so
the order of last hearing is the order of expiry, and ``Deadlines`` is an ordered dict (a
heartbeat moves one node to its end, a sweep pops only the expired from its front). Because
only the last window's deafness counts, a tracker late by L every cycle still expires a dead
node within about two windows, whatever L (a listening clock that subtracts all deaf time
would run at P/(P+L) and let a dead node live for ever as L grows).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId

Sleep = Callable[[float], Awaitable[None]]


class Hearing:
    """How deaf the tracker has been lately: the grace a node's window gets for it."""

    def __init__(self, clock: Callable[[], float], window_s: float) -> None:
        if window_s <= 0:
            raise InvalidArgument("the expiry window must be > 0 seconds")
        self._clock = clock
        self._window_s = window_s
        self._covered_until = clock()
        """Lateness is counted from here on: a stall already reported is not counted twice."""
        self._due: float | None = None
        """When the watcher expects to run next; None while nobody watches the loop."""
        self._last_late_s = 0.0
        self._lateness: deque[tuple[float, float]] = deque()
        """(when the watcher woke, how late it was), oldest first, the last window's only."""
        self._strained_since: dict[str, float] = {}
        """Strain sources on now, and since when."""
        self._strains: deque[tuple[float, float]] = deque()
        """Finished strained spans (start, end), merged where they touch, oldest first."""
        self._late_total_s = 0.0
        self._strained_total_s = 0.0
        """The sums of the two deques, kept as they change: every sweep asks for the grace."""

    def expect(self, due: float) -> None:
        """The loop's watcher sleeps until ``due``: being later than that is deafness."""
        self._due = due

    @property
    def expected_at(self) -> float | None:
        """When the watcher is due next (None: not armed); lets a test step a manual clock with it."""
        return self._due

    def woke(self) -> float:
        """The watcher ran: account for how late it ran; returns that lateness in seconds."""
        now = self._clock()
        late = self._overdue(now)
        if late > 0:
            self._lateness.append((now, late))
            self._late_total_s += late
        self._covered_until = max(self._covered_until, now)
        self._due = None
        self._last_late_s = late
        return late

    def lag_s(self) -> float:
        """How far behind the loop is right now (0 while the watcher is not yet due)."""
        return self._overdue(self._clock())

    def recent_lag_s(self) -> float:
        """The current lag, or the last one measured if larger: a busy loop runs its watcher late
        every time, and is no less busy in the moment just after it ran."""
        return max(self.lag_s(), self._last_late_s)

    def strain(self, source: str, on: bool) -> None:
        """``source`` (admission shedding, the store's queue) is strained from now, or no longer."""
        now = self._clock()
        if on:
            self._strained_since.setdefault(source, now)
            return
        since = self._strained_since.pop(source, None)
        if since is None or now <= since:
            return
        if self._strains and since <= self._strains[-1][1]:
            start, end = self._strains.pop()
            self._strained_total_s -= end - start
            since, now = min(since, start), max(now, end)
        self._strains.append((since, now))
        self._strained_total_s += now - since

    def grace_s(self) -> float:
        """Seconds of deafness in the last window: how much longer than the window a node may be silent."""
        now = self._clock()
        horizon = now - self._window_s
        while self._lateness and self._lateness[0][0] <= horizon:
            self._late_total_s -= self._lateness.popleft()[1]
        while self._strains and self._strains[0][1] <= horizon:
            start, end = self._strains.popleft()
            self._strained_total_s -= end - start
        if not self._lateness:
            self._late_total_s = 0.0  # no rounding drift left behind
        if not self._strains:
            self._strained_total_s = 0.0
        late = self._late_total_s + self._overdue(now)
        strained = self._strained_total_s + sum(now - since for since in self._strained_since.values())
        return late + min(self._window_s, strained)

    def listening_now(self) -> float:
        """The time heard times are kept on (the monotonic clock; ``grace_s`` allows for deafness)."""
        return self._clock()

    def _overdue(self, now: float) -> float:
        if self._due is None:
            return 0.0
        return max(0.0, now - max(self._due, self._covered_until))


async def watch_loop(
    hearing: Hearing, clock: Callable[[], float], period_s: float, sleep: Sleep = asyncio.sleep
) -> None:
    """Watch the event loop for ever: how late this task wakes is time the tracker could not
    listen. It does nothing else, so a sweep waiting on the store never leaves the loop unwatched."""
    while True:
        hearing.expect(clock() + period_s)
        await sleep(period_s)
        hearing.woke()


class Deadlines:
    """Nodes by when they were last heard, oldest first."""

    def __init__(self, expire_after_s: float) -> None:
        if expire_after_s <= 0:
            raise InvalidArgument("the expiry window must be > 0 seconds")
        self._expire_after_s = expire_after_s
        self._heard: OrderedDict[NodeId, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._heard)

    def heard(self, node_id: NodeId, now: float) -> None:
        """``node_id`` was heard at ``now`` (registered or heartbeated): its window starts again."""
        self._heard[node_id] = now
        self._heard.move_to_end(node_id)

    def forget(self, node_id: NodeId) -> None:
        self._heard.pop(node_id, None)

    def expired(self, now: float, grace_s: float = 0.0) -> tuple[NodeId, ...]:
        """The nodes silent for the window plus ``grace_s`` (the tracker's own recent deafness),
        oldest first, forgotten here; touches no other."""
        gone: list[NodeId] = []
        for node_id, heard in self._heard.items():
            if now - heard < self._expire_after_s + grace_s:
                break
            gone.append(node_id)
        for node_id in gone:
            del self._heard[node_id]
        return tuple(gone)
