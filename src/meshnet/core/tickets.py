"""Route tickets: the tracker's signed word that one session may run on these hops, in this order,
until a given time; and the pure checks a shard makes of one before it opens a session.

Why a ticket: a shard used to trust the hops an opening frame named, so any party able to send
it a frame (a gateway, or the worker before it) could make it dial any address (a port-scan
oracle from inside the swarm's network) or open sessions on a shard no route ever sent it to.
Now only the tracker says where a session goes: it signs a ``RouteTicket`` with its own
certificate's key (``security.tickets``), the route client carries it in the opening frame, and
every shard refuses an opening frame unless ``check_opening`` accepts the ticket for it; the next
hop it dials is then the ticket's, never the frame's alone.

``RouteTicket`` is what a ticket says; ``SealedTicket`` is the ticket as it travels: the encoded
body (``wire.ticket_wire``) exactly as signed, the signature and the signer's certificate. On an
unsecured (``--insecure``, loopback) swarm tickets are unsigned and checked for everything but
the signature and the sender, so the code path is the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from meshnet.core.addresses import parse_relayed
from meshnet.core.checks import check_text
from meshnet.core.errors import InvalidArgument, TicketRefused
from meshnet.core.ids import NodeId, RequestId, SessionId, check_node_id
from meshnet.core.layers import LayerRange

DEFAULT_TICKET_S = 900.0
"""Life of a ticket for a request that names no deadline. A session lives no longer than its
ticket (its shards release it then), so this bounds what a session with no deadline can hold."""
MAX_TICKET_S = 86_400.0
"""The longest ticket the tracker grants: a request's longest deadline (``GenerationRequest``)."""
TICKET_MARGIN_S = 30.0
"""Added to a request's deadline when asking for its ticket: the request ends (and releases its
sessions) on its deadline, never because its ticket ran out first."""
CLOCK_SKEW_S = 30.0
"""How far a shard's wall clock may run ahead of the tracker's before a fresh ticket reads as
expired there (certificates allow five minutes; a ticket's life is shorter)."""
MAX_TICKET_BODY_BYTES = 32 * 1024
"""An encoded body: 64 hops of 256-character addresses and ids fit with room to spare."""
MAX_SIGNATURE_BYTES = 256
MAX_SIGNER_BYTES = 8 * 1024
"""A signer's certificate, PEM: about 800 bytes for ours."""
MAX_TICKET_HOPS = 64


@dataclass(frozen=True)
class TicketHop:
    """One hop as the ticket names it: the node, where it listens, the layers it runs."""

    node_id: NodeId
    address: str
    layers: LayerRange

    def __post_init__(self) -> None:
        check_node_id(self.node_id)
        check_text("ticket hop address", self.address)


@dataclass(frozen=True)
class RouteTicket:
    """The route one session may run on: every hop in order, its epoch, its recipe, its life."""

    session_id: SessionId
    request_id: RequestId | None
    """The one request it is for; None: any request of the session."""
    hops: tuple[TicketHop, ...]
    epoch: int
    fingerprint: str
    issued_at_unix_s: float
    expires_at_unix_s: float
    holder: NodeId | None
    """Who may open the head's session: the party the tracker gave the ticket to (ChooseRoute's
    caller). None on an unsecured swarm, where nobody has a checked identity."""

    def __post_init__(self) -> None:
        check_text("ticket session id", self.session_id)
        if self.request_id is not None:
            check_text("ticket request id", self.request_id)
        check_text("ticket fingerprint", self.fingerprint)
        if self.holder is not None:
            check_node_id(self.holder)
        if not 1 <= len(self.hops) <= MAX_TICKET_HOPS:
            raise InvalidArgument(f"a ticket names 1 to {MAX_TICKET_HOPS} hops, got {len(self.hops)}")
        if self.hops[0].layers.start != 0:
            raise InvalidArgument(f"a ticket's route starts at layer 0, not {self.hops[0].layers.start}")
        for before, after in zip(self.hops, self.hops[1:], strict=False):
            if before.layers.stop != after.layers.start:
                raise InvalidArgument(f"ticket hops {before.layers} and {after.layers} do not meet")
        if not 0 <= self.epoch < 2**63:
            raise InvalidArgument(f"a ticket's epoch must be in [0, 2**63), got {self.epoch}")
        times = (self.issued_at_unix_s, self.expires_at_unix_s)
        if not all(math.isfinite(t) and t >= 0 for t in times) or self.expires_at_unix_s <= self.issued_at_unix_s:
            raise InvalidArgument(f"a ticket must expire after it was issued, got {times}")


@dataclass(frozen=True)
class SealedTicket:
    """A ticket as it travels: the encoded body exactly as signed, and who signed it."""

    body: bytes
    signature: bytes = b""
    """Empty: unsigned (an unsecured swarm)."""
    signer: bytes = b""
    """The signing tracker's certificate (PEM); empty when unsigned."""

    def __post_init__(self) -> None:
        sizes = (
            (self.body, MAX_TICKET_BODY_BYTES),
            (self.signature, MAX_SIGNATURE_BYTES),
            (self.signer, MAX_SIGNER_BYTES),
        )
        for value, limit in sizes:
            if not isinstance(value, bytes) or len(value) > limit:
                raise InvalidArgument(f"a ticket part must be at most {limit} bytes")
        if not self.body:
            raise InvalidArgument("a ticket carries a body")
        if bool(self.signature) != bool(self.signer):
            raise InvalidArgument("a signed ticket carries both its signature and its signer's certificate")

    @property
    def signed(self) -> bool:
        return bool(self.signature)


def ticket_seconds(timeout_s: float | None) -> float:
    """How long a ticket for a request with deadline ``timeout_s`` (None: none) should last."""
    if timeout_s is None:
        return DEFAULT_TICKET_S
    return min(timeout_s + TICKET_MARGIN_S, MAX_TICKET_S)


def granted_seconds(asked_s: float) -> float:
    """The life the tracker grants for ``asked_s`` (0: the default), within ``MAX_TICKET_S``."""
    if not math.isfinite(asked_s) or asked_s <= 0:
        return DEFAULT_TICKET_S
    return min(asked_s, MAX_TICKET_S)


@dataclass(frozen=True)
class Opening:
    """What a shard knows of an opening frame and of itself when it checks the frame's ticket."""

    session_id: SessionId
    request_id: RequestId
    epoch: int
    fingerprint: str
    node_id: str
    address: str
    layers: LayerRange
    downstream: Sequence[tuple[str, str, LayerRange]]
    """The hops the frame asks this shard to forward to: (node id, address, layers), in order."""
    opener: str | None
    """The node id of the certificate that sent the frame; None on an unsecured swarm."""


def check_opening(ticket: RouteTicket, opening: Opening, *, now_unix_s: float, secured: bool) -> int:
    """This shard's position on ``ticket``'s route if it allows ``opening``; else ``TicketRefused``
    saying what does not match. ``secured``: the sender's identity was checked (mTLS)."""
    _check_session(ticket, opening, now_unix_s)
    position = _position(ticket, opening)
    named = tuple((hop.node_id, hop.address, hop.layers) for hop in ticket.hops[position + 1 :])
    if tuple(opening.downstream) != named:
        raise TicketRefused(
            f"the frame's downstream hops are not the ticket's after this shard (ticket: "
            f"{[address for _, address, _ in named]}); nothing was dialled"
        )
    if secured:
        expected = ticket.holder if position == 0 else ticket.hops[position - 1].node_id
        if expected is None or opening.opener != expected:
            role = "its holder" if position == 0 else "the hop before this one"
            raise TicketRefused(f"node {opening.opener} may not open this session here: the ticket names {role}")
    return position


def _check_session(ticket: RouteTicket, opening: Opening, now_unix_s: float) -> None:
    if ticket.session_id != opening.session_id:
        raise TicketRefused(f"the ticket is for session {ticket.session_id}, not {opening.session_id}")
    if ticket.request_id is not None and ticket.request_id != opening.request_id:
        raise TicketRefused(f"the ticket is for request {ticket.request_id}, not {opening.request_id}")
    if ticket.epoch != opening.epoch:
        raise TicketRefused(f"the ticket is for route epoch {ticket.epoch}, the frame carries {opening.epoch}")
    if ticket.fingerprint != opening.fingerprint:
        raise TicketRefused(f"the ticket is for recipe {ticket.fingerprint}, not {opening.fingerprint}")
    if now_unix_s > ticket.expires_at_unix_s + CLOCK_SKEW_S:
        raise TicketRefused(
            f"the ticket expired {now_unix_s - ticket.expires_at_unix_s:.0f} s ago; ask for a route again"
        )


def _reaches_this_shard(address: str, opening: Opening) -> bool:
    """The shard's own address, or (a node behind NAT) its relayed address at whichever relay
    carries it now: ``NODE@RELAY`` reaches only the node whose TLS name the dialer pinned."""
    if address == opening.address:
        return True
    try:
        relayed = parse_relayed(address)
    except InvalidArgument:
        return False
    return relayed is not None and relayed.node_id == opening.node_id


def _position(ticket: RouteTicket, opening: Opening) -> int:
    for index, hop in enumerate(ticket.hops):
        if hop.node_id == opening.node_id:
            if not _reaches_this_shard(hop.address, opening) or hop.layers != opening.layers:
                raise TicketRefused(
                    f"the ticket names node {hop.node_id} at {hop.address} for layers {hop.layers}; "
                    f"this shard is at {opening.address} with layers {opening.layers}"
                )
            return index
    raise TicketRefused(f"the ticket does not name node {opening.node_id}: this shard is not on its route")
