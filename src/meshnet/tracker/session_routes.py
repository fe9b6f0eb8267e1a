"""Sessions' sticky routes: the route each session was last given, while it is used.

A session keeps its route while every node on it lives (``tracker.registry`` decides that),
because moving a live session throws away its KV cache and costs a full replay. Routes idle past
their TTL are forgotten, and the least recently used go first once there are too many, so the
table is bounded whatever clients do. Owned by the registry's event loop (no locks).

Nothing here scans the table: the routes are kept in order of last use (the clock is monotonic,
so that is also the order of idleness) and expiry pops only the idle from the front, and an index
from node to the sessions routed through it releases a lost node's sessions without visiting the
others. At 100 routes/s and a 600 s TTL the table holds ~60k sessions; scanning it on every
tracker call was what made a busy tracker slower by the minute (issue 36).

A session whose route lost a node comes back at once for a new one; until then it is still a live
session (admission never sheds it), so the sessions dropped that way are remembered for a short
while (``dropped_ttl_s``), bounded like the routes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Set
from dataclasses import dataclass

from meshnet.core.ids import NodeId, SessionId
from meshnet.core.tracking import Route


@dataclass(frozen=True)
class _StickyRoute:
    route: Route
    last_used: float


class SessionRoutes:
    """Each session's last route, least recently used first."""

    def __init__(self, *, ttl_s: float, max_sessions: int, dropped_ttl_s: float = 60.0) -> None:
        self._ttl_s = ttl_s
        self._max_sessions = max_sessions
        self._dropped_ttl_s = dropped_ttl_s
        self._dropped: OrderedDict[SessionId, float] = OrderedDict()
        """Sessions whose route lost a node -> when, oldest first."""
        self._routes: OrderedDict[SessionId, _StickyRoute] = OrderedDict()
        self._through: dict[NodeId, set[SessionId]] = {}
        """Node -> the sessions whose route passes through it."""

    def __len__(self) -> int:
        return len(self._routes)

    def get(self, session_id: SessionId) -> Route | None:
        sticky = self._routes.get(session_id)
        return None if sticky is None else sticky.route

    def recently_dropped(self, session_id: SessionId) -> bool:
        """Whether ``session_id`` lost its route to a lost node within ``dropped_ttl_s``."""
        return session_id in self._dropped

    def touch(self, session_id: SessionId, route: Route, now: float) -> None:
        """``session_id`` uses ``route`` now; the least recently used beyond the bound go."""
        self._dropped.pop(session_id, None)
        old = self._routes.get(session_id)
        if old is not None and old.route.node_ids != route.node_ids:
            self._unindex(session_id, old.route)
        if old is None or old.route.node_ids != route.node_ids:
            for node_id in route.node_ids:
                self._through.setdefault(node_id, set()).add(session_id)
        self._routes[session_id] = _StickyRoute(route, last_used=now)
        self._routes.move_to_end(session_id)
        while len(self._routes) > self._max_sessions:
            self._forget(next(iter(self._routes)))

    def expire(self, now: float) -> None:
        """Forget routes idle past the TTL (only those: the rest are newer than the first kept)."""
        self._expire_dropped(now)
        while self._routes:
            session_id, sticky = next(iter(self._routes.items()))
            if now - sticky.last_used < self._ttl_s:
                return
            self._forget(session_id)

    def drop_through(self, gone: Set[NodeId], now: float) -> None:
        """Forget the routes that pass through a node in ``gone``: those routes are lost, their
        sessions remembered as live for a while."""
        broken = set().union(*(self._through.get(node_id, ()) for node_id in gone))
        for session_id in sorted(broken):  # sorted: which the bound drops first is reproducible
            self._forget(session_id)
            self._dropped[session_id] = now
            self._dropped.move_to_end(session_id)
        self._expire_dropped(now)
        while len(self._dropped) > self._max_sessions:
            self._dropped.popitem(last=False)

    def _expire_dropped(self, now: float) -> None:
        while self._dropped and now - next(iter(self._dropped.values())) >= self._dropped_ttl_s:
            self._dropped.popitem(last=False)

    def _forget(self, session_id: SessionId) -> None:
        sticky = self._routes.pop(session_id, None)
        if sticky is not None:
            self._unindex(session_id, sticky.route)

    def _unindex(self, session_id: SessionId, route: Route) -> None:
        for node_id in route.node_ids:
            sessions = self._through.get(node_id)
            if sessions is None:
                continue
            sessions.discard(session_id)
            if not sessions:
                del self._through[node_id]
