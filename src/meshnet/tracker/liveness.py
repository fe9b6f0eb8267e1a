"""When the tracker could last have heard each node, and who has been silent too long.

A node expires after ``expire_after_s`` of silence, but silence is judged on the tracker's
*listening* clock, not the wall: time the tracker itself could not listen (its event loop
stalled, or so far behind that a heartbeat that arrived waited in the queue) is not the node's
silence. Without that, a tracker behind on its work (a mass join after a restart, a burst of
routes) expires the very nodes whose heartbeats it has not got round to reading; they all
register again, adding to the load that made it late: the collapse issue 36 measured.

``Hearing`` measures that deafness. The periodic sweep task says when it expects to run next
(``expect``) and reports when it did (``woke``); the gap is time the loop could not run.
While it is overdue, the overdue part counts as deaf already, so a handler that runs first
after a stall (queued before the sweep's own callback) does not expire anyone for it. Heard
times are kept on the listening clock, which never goes backwards, so the order of last hearing
is the order of expiry: ``Deadlines`` is an ordered dict, a heartbeat moves one node to its
end (O(1)) and a sweep pops only the expired from its front.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId


class Hearing:
    """The tracker's listening clock: the monotonic clock less the time it could not listen."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._deaf_s = 0.0
        """Deaf time already accounted for, up to ``_covered_until``."""
        self._covered_until = clock()
        self._due: float | None = None
        """When the sweep task expects to run next; None while nobody watches the loop."""
        self._last_late_s = 0.0

    def expect(self, due: float) -> None:
        """The loop's watcher (the sweep task) sleeps until ``due``: being later than that is deafness."""
        self._due = due

    @property
    def expected_at(self) -> float | None:
        """When the watcher is due next (None: not armed); lets a test step a manual clock with it."""
        return self._due

    def woke(self) -> float:
        """The watcher ran: account for how late it ran; returns that lateness in seconds."""
        now = self._clock()
        late = self._overdue(now)
        self._deaf_s += late
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

    def deaf_s(self) -> float:
        """Seconds the tracker could not listen since it started, the current stall included."""
        return self._deaf_s + self.lag_s()

    def listening_now(self) -> float:
        """The listening clock: never goes backwards, and stands still while the loop is stalled."""
        return self._clock() - self.deaf_s()

    def _overdue(self, now: float) -> float:
        if self._due is None:
            return 0.0
        return max(0.0, now - max(self._due, self._covered_until))


class Deadlines:
    """Nodes by when they were last heard (on the listening clock), oldest first."""

    def __init__(self, expire_after_s: float) -> None:
        if expire_after_s <= 0:
            raise InvalidArgument("the expiry window must be > 0 seconds")
        self._expire_after_s = expire_after_s
        self._heard: OrderedDict[NodeId, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._heard)

    def heard(self, node_id: NodeId, listening_now: float) -> None:
        """``node_id`` was heard now (registered or heartbeated): its window starts again."""
        self._heard[node_id] = listening_now
        self._heard.move_to_end(node_id)

    def forget(self, node_id: NodeId) -> None:
        self._heard.pop(node_id, None)

    def expired(self, listening_now: float) -> tuple[NodeId, ...]:
        """The nodes silent for the whole window, oldest first, forgotten here; touches no other."""
        gone: list[NodeId] = []
        for node_id, heard in self._heard.items():
            if listening_now - heard < self._expire_after_s:
                break
            gone.append(node_id)
        for node_id in gone:
            del self._heard[node_id]
        return tuple(gone)
