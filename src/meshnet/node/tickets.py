"""A shard's check of route tickets: before it opens a session or dials a next hop, and while
it holds the session.

Every opening frame must carry the tracker's ticket for its session's route (``core.tickets``).
The gate verifies the signature (a secured shard accepts only a tracker certificate of its CA;
an unsecured one checks no signature), then that the ticket is for this session, request,
epoch and recipe, is not expired, names this node at this address and range, names as the hops
after it exactly the ones the frame asks it to forward to (so the next hop it dials is the
ticket's: no frame can make it dial anything else), and, secured, that the frame came from the
party the ticket names before this hop. Only then does the shard open (or take over) a session.

A session's life is bounded by its ticket: the gate keeps each held session's expiry, and the
shard's sweep releases the sessions whose tickets ran out (``Shard.expire_idle``). A route
client asks for a ticket as long as its request's deadline (``core.tickets.ticket_seconds``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from meshnet.core.errors import TicketRefused
from meshnet.core.ids import SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.tickets import CLOCK_SKEW_S, Opening, RouteTicket, check_opening
from meshnet.security.tickets import TicketVerifier
from meshnet.wire.frames import StepFrame
from meshnet.wire.ticket_wire import open_ticket


class TicketGate:
    """Checks opening frames' tickets for one shard, and remembers when each session's runs out.

    ``verifier``: the swarm's (secured); None on an unsecured shard, which checks no signature
    and no sender. ``wall_clock``: Unix seconds, the scale tickets are written in."""

    def __init__(self, verifier: TicketVerifier | None, wall_clock: Callable[[], float] = time.time) -> None:
        self._verifier = verifier
        self._clock = wall_clock
        self._expiry: dict[SessionId, tuple[int, float]] = {}
        """Held sessions: the route epoch each was opened on, and when its ticket expires."""

    def admit(
        self, frame: StepFrame, node_id: str, address: str, layers: LayerRange, opener: str | None
    ) -> RouteTicket:
        """The ticket of opening ``frame`` if it lets this shard (``node_id`` at ``address``,
        running ``layers``) open the session and forward as the frame asks; ``TicketRefused``
        otherwise. ``opener``: the node id of the frame's sender (None unsecured)."""
        if frame.ticket is None:
            raise TicketRefused("an opening frame carries its route's ticket: ask the tracker for a route")
        ticket = open_ticket(frame.ticket, self._verifier)
        meta = frame.meta
        opening = Opening(
            session_id=meta.session_id,
            request_id=meta.request_id,
            epoch=meta.route_epoch,
            fingerprint=meta.fingerprint,
            node_id=node_id,
            address=address,
            layers=layers,
            downstream=tuple((hop.node_id, hop.address, hop.layers) for hop in frame.downstream),
            opener=opener,
        )
        check_opening(ticket, opening, now_unix_s=self._clock(), secured=self._verifier is not None)
        return ticket

    def hold(self, key: SessionId, epoch: int, ticket: RouteTicket) -> None:
        """The session ``key`` opened on route epoch ``epoch`` lives until ``ticket`` expires."""
        self._expiry[key] = (epoch, ticket.expires_at_unix_s)

    def release(self, key: SessionId, epoch: int) -> None:
        """The session opened on ``epoch`` ended here (a newer route's entry stays)."""
        if self._expiry.get(key, (None, 0.0))[0] == epoch:
            del self._expiry[key]

    def expired(self) -> list[tuple[SessionId, int]]:
        """Held sessions whose tickets have run out: (session, the epoch it was opened on). They
        are forgotten here as they are returned, so one the shard let go of otherwise (an
        eviction) is not asked about again."""
        now = self._clock()
        lapsed = [(key, epoch) for key, (epoch, expires) in self._expiry.items() if now > expires + CLOCK_SKEW_S]
        for key, _ in lapsed:
            del self._expiry[key]
        return lapsed
