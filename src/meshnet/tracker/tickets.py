"""The tracker's side of route tickets: every route chosen for a session leaves with one.

A ticket names the session (and the request, when the caller gave it), every hop of the route
in order with its node id, address and layers, the route's epoch and recipe, an expiry, and the
party it was given to (``core.tickets``). A secured tracker signs it with its own certificate's
key, which every shard checks against the swarm CA it already trusts (``security.tickets``); an
unsecured one issues it unsigned. A route for no session (a probe) gets none: it opens nothing.
A failover's new route gets a new ticket of its newer epoch, which is what lets it take the
session over on a shard still holding the lost route's (``node.shard.Shard._supersede``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from meshnet.core.ids import NodeId
from meshnet.core.tickets import granted_seconds
from meshnet.core.tracking import Route, RouteQuery
from meshnet.security.tickets import TicketSigner
from meshnet.wire.ticket_wire import issue_ticket


class TicketIssuer:
    """Issues the ticket of each session route, signed by ``signer`` (None: unsigned)."""

    def __init__(self, signer: TicketSigner | None, wall_clock: Callable[[], float]) -> None:
        self._signer = signer
        self._clock = wall_clock

    def issue(self, route: Route, query: RouteQuery, holder: str | None) -> Route:
        """``route`` with its ticket for ``query``'s session, given to ``holder`` (the caller's
        node id; None on an unsecured tracker); unchanged for a query without a session."""
        if query.session_id is None:
            return route
        ticket = issue_ticket(
            route.hops,
            session_id=query.session_id,
            request_id=query.request_id,
            epoch=route.epoch,
            fingerprint=route.fingerprint,
            holder=None if holder is None else NodeId(holder),
            now_unix_s=self._clock(),
            seconds=granted_seconds(query.ticket_seconds),
            signer=self._signer,
        )
        return replace(route, ticket=ticket)
