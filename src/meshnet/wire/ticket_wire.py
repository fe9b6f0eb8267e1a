"""ticket.proto <-> ``core.tickets``: a ticket's body as the bytes the tracker signs, and a sealed
ticket as it travels in a route reply and an opening frame.

``seal`` encodes a ``RouteTicket`` once and signs those bytes (or leaves them unsigned on an
unsecured swarm); ``open_ticket`` verifies the signature over the bytes received, then decodes
them, bounded: nothing of a body is read before its size is checked, and a malformed one is a
``TicketRefused``, never a parser's exception.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from google.protobuf.message import DecodeError

from meshnet.core.errors import InvalidArgument, TicketRefused
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.tickets import MAX_TICKET_BODY_BYTES, RouteTicket, SealedTicket, TicketHop
from meshnet.security.tickets import TicketSigner, TicketVerifier
from meshnet.wire.generated import ticket_pb2 as pb


def body_to_bytes(ticket: RouteTicket) -> bytes:
    message = pb.RouteTicketBody(
        session_id=ticket.session_id,
        request_id=ticket.request_id or "",
        hops=[
            pb.RouteTicketBody.Hop(
                node_id=hop.node_id, address=hop.address, layer_start=hop.layers.start, layer_stop=hop.layers.stop
            )
            for hop in ticket.hops
        ],
        epoch=ticket.epoch,
        fingerprint=ticket.fingerprint,
        issued_at_unix_ms=round(ticket.issued_at_unix_s * 1000),
        expires_at_unix_ms=round(ticket.expires_at_unix_s * 1000),
        holder_node_id=ticket.holder or "",
    )
    return message.SerializeToString(deterministic=True)


def body_from_bytes(body: bytes) -> RouteTicket:
    """The ticket ``body`` encodes; ``TicketRefused`` when it is oversized or malformed."""
    if len(body) > MAX_TICKET_BODY_BYTES:
        raise TicketRefused(f"a route ticket's body is at most {MAX_TICKET_BODY_BYTES} bytes, got {len(body)}")
    message = pb.RouteTicketBody()
    try:
        message.ParseFromString(body)
        return RouteTicket(
            session_id=SessionId(message.session_id),
            request_id=RequestId(message.request_id) if message.request_id else None,
            hops=tuple(
                TicketHop(NodeId(hop.node_id), hop.address, LayerRange(hop.layer_start, hop.layer_stop))
                for hop in message.hops
            ),
            epoch=message.epoch,
            fingerprint=message.fingerprint,
            issued_at_unix_s=message.issued_at_unix_ms / 1000,
            expires_at_unix_s=message.expires_at_unix_ms / 1000,
            holder=NodeId(message.holder_node_id) if message.holder_node_id else None,
        )
    except (DecodeError, InvalidArgument) as error:
        raise TicketRefused(f"the route ticket is malformed: {error}") from None


def seal(ticket: RouteTicket, signer: TicketSigner | None) -> SealedTicket:
    """``ticket`` encoded and signed by ``signer`` (None: unsigned, on an unsecured swarm)."""
    body = body_to_bytes(ticket)
    return SealedTicket(body) if signer is None else signer.seal(body)


class PlacedHop(Protocol):
    """A hop as a route names it (``RouteHop``, ``HopSpec``): the node, its address, its layers."""

    @property
    def node_id(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def layers(self) -> LayerRange: ...


def issue_ticket(
    hops: Sequence[PlacedHop],
    *,
    session_id: SessionId,
    request_id: RequestId | None,
    epoch: int,
    fingerprint: str,
    holder: NodeId | None,
    now_unix_s: float,
    seconds: float,
    signer: TicketSigner | None,
) -> SealedTicket:
    """The sealed ticket for ``session_id`` on ``hops`` (head first), lasting ``seconds`` from
    ``now_unix_s``, given to ``holder``: by the tracker for every session route, and by a launcher
    beside the CA that builds routes without one (the bench's lanes)."""
    ticket = RouteTicket(
        session_id=session_id,
        request_id=request_id,
        hops=tuple(TicketHop(NodeId(hop.node_id), hop.address, hop.layers) for hop in hops),
        epoch=epoch,
        fingerprint=fingerprint,
        issued_at_unix_s=now_unix_s,
        expires_at_unix_s=now_unix_s + seconds,
        holder=holder,
    )
    return seal(ticket, signer)


def open_ticket(sealed: SealedTicket, verifier: TicketVerifier | None) -> RouteTicket:
    """What ``sealed`` says, once its signature verified (``verifier`` None: an unsecured swarm,
    which checks no signature). Raises ``TicketRefused``."""
    if verifier is not None:
        verifier.verify(sealed)
    return body_from_bytes(sealed.body)


def sealed_to_proto(sealed: SealedTicket) -> pb.RouteTicket:
    return pb.RouteTicket(body=sealed.body, signature=sealed.signature, signer_certificate=sealed.signer)


def sealed_from_proto(message: pb.RouteTicket) -> SealedTicket:
    """A received ticket, its parts bounded (``InvalidArgument`` otherwise); not yet verified."""
    return SealedTicket(message.body, message.signature, message.signer_certificate)
