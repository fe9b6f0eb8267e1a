"""Route tickets are signed by the tracker's certificate key and accepted only from a tracker
certificate of the shard's own swarm CA (``security.tickets``, ``wire.ticket_wire``): real keys
and certificates, minted here from a real CA."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from meshnet.core.errors import TicketRefused
from meshnet.core.events import RouteHop
from meshnet.core.ids import NodeId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeCapability
from meshnet.core.tickets import SealedTicket
from meshnet.security.certificates import SwarmAuthority, create_authority, mint_node
from meshnet.security.identity import Role
from meshnet.security.tickets import TicketSigner, TicketVerifier
from meshnet.wire.ticket_wire import issue_ticket, open_ticket

NOW = time.time()
CAPABILITY = NodeCapability(
    n_ctx_per_session=64,
    prefill_chunk_tokens=8,
    max_tokens_per_frame=64,
    max_frame_bytes=1 << 20,
    n_embd=16,
    max_sessions=2,
)
HOPS = (
    RouteHop(NodeId("w-head"), "10.0.0.1:7001", LayerRange(0, 3), CAPABILITY),
    RouteHop(NodeId("w-tail"), "10.0.0.2:7001", LayerRange(3, 6), CAPABILITY),
)
AUTHORITY = create_authority("tickets", NOW)


def ticket(signer: TicketSigner | None, *, session: str = "s-1") -> SealedTicket:
    return issue_ticket(
        HOPS,
        session_id=SessionId(session),
        request_id=None,
        epoch=7,
        fingerprint="rcp-1",
        holder=NodeId("g-1"),
        now_unix_s=NOW,
        seconds=60.0,
        signer=signer,
    )


def signer(role: Role, authority: SwarmAuthority = AUTHORITY) -> TicketSigner:
    node = mint_node(authority, node_id=f"{role[0]}-signer", role=role, now_unix_s=NOW)
    return TicketSigner(lambda: node)


def verifier() -> TicketVerifier:
    return TicketVerifier(AUTHORITY.cert_pem, lambda: NOW)


def test_a_tracker_signed_ticket_opens_to_what_the_tracker_wrote() -> None:
    opened = open_ticket(ticket(signer("tracker")), verifier())
    assert opened.session_id == "s-1" and opened.epoch == 7 and opened.holder == "g-1"
    assert [(hop.node_id, hop.address, hop.layers) for hop in opened.hops] == [
        (hop.node_id, hop.address, hop.layers) for hop in HOPS
    ]


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("unsigned", "unsigned"),
        ("signed by a worker", "worker certificate"),
        ("signed by another CA's tracker", "not of this swarm"),
        ("body altered", "does not verify"),
    ],
)
def test_only_a_tracker_of_this_ca_can_sign_a_ticket(name: str, match: str) -> None:
    tracker_signed = ticket(signer("tracker"))
    sealed = {
        "unsigned": ticket(None),
        "signed by a worker": ticket(signer("worker")),
        "signed by another CA's tracker": ticket(signer("tracker", create_authority("other", NOW))),
        "body altered": replace(tracker_signed, body=ticket(None, session="s-2").body),
    }[name]
    with pytest.raises(TicketRefused, match=match):
        open_ticket(sealed, verifier())


def test_a_malformed_body_is_a_typed_refusal() -> None:
    with pytest.raises(TicketRefused, match="malformed"):
        open_ticket(replace(ticket(None), body=b"\xff\x00garbage"), None)
