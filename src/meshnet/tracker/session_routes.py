"""Sessions' sticky routes: the route each session was last given, while it is used.

A session keeps its route while every node on it lives (``tracker.registry`` decides that),
because moving a live session throws away its KV cache and costs a full replay. Routes idle past
their TTL are forgotten, and the least recently used go first once there are too many, so the
table is bounded whatever clients do. Owned by the registry's event loop (no locks).
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

    def __init__(self, *, ttl_s: float, max_sessions: int) -> None:
        self._ttl_s = ttl_s
        self._max_sessions = max_sessions
        self._routes: OrderedDict[SessionId, _StickyRoute] = OrderedDict()

    def get(self, session_id: SessionId) -> Route | None:
        sticky = self._routes.get(session_id)
        return None if sticky is None else sticky.route

    def touch(self, session_id: SessionId, route: Route, now: float) -> None:
        """``session_id`` uses ``route`` now; the least recently used beyond the bound go."""
        self._routes[session_id] = _StickyRoute(route, last_used=now)
        self._routes.move_to_end(session_id)
        while len(self._routes) > self._max_sessions:
            self._routes.popitem(last=False)

    def expire(self, now: float) -> None:
        """Forget routes idle past the TTL."""
        idle = [sid for sid, sticky in self._routes.items() if now - sticky.last_used >= self._ttl_s]
        for session_id in idle:
            del self._routes[session_id]

    def drop_through(self, gone: Set[NodeId]) -> None:
        """Forget the routes that pass through a node in ``gone``: those sessions are lost."""
        broken = [sid for sid, sticky in self._routes.items() if not gone.isdisjoint(sticky.route.node_ids)]
        for session_id in broken:
            del self._routes[session_id]
