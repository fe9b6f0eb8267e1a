"""What a shard checks of an opening frame's route ticket (``core.tickets.check_opening``): pure."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshnet.core.errors import TicketRefused
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.tickets import CLOCK_SKEW_S, Opening, RouteTicket, TicketHop, check_opening, granted_seconds

NOW = 1_800_000_000.0
HOPS = (
    TicketHop(NodeId("w-head"), "10.0.0.1:7001", LayerRange(0, 2)),
    TicketHop(NodeId("w-mid"), "10.0.0.2:7001", LayerRange(2, 4)),
    TicketHop(NodeId("w-tail"), "10.0.0.3:7001", LayerRange(4, 6)),
)
TICKET = RouteTicket(SessionId("s-1"), RequestId("r-1"), HOPS, 3, "rcp-1", NOW, NOW + 60, NodeId("g-1"))


def at(position: int, *, opener: str | None = None, **changes: object) -> Opening:
    """The opening frame hop ``position`` receives on the ticket's route, from the right sender."""
    hop = HOPS[position]
    sender = opener or (TICKET.holder if position == 0 else HOPS[position - 1].node_id)
    opening = Opening(
        session_id=SessionId("s-1"),
        request_id=RequestId("r-1"),
        epoch=3,
        fingerprint="rcp-1",
        node_id=hop.node_id,
        address=hop.address,
        layers=hop.layers,
        downstream=tuple((h.node_id, h.address, h.layers) for h in HOPS[position + 1 :]),
        opener=sender,
    )
    return replace(opening, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize("position", [0, 1, 2])
def test_every_hop_of_the_route_opens_from_the_party_before_it(position: int) -> None:
    assert check_opening(TICKET, at(position), now_unix_s=NOW, secured=True) == position


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"session_id": "s-2"}, "session"),
        ({"request_id": "r-2"}, "request"),
        ({"epoch": 4}, "epoch"),
        ({"fingerprint": "rcp-2"}, "recipe"),
        ({"node_id": "w-other"}, "does not name node"),
        ({"address": "10.0.0.9:7001"}, "this shard is at"),
        ({"downstream": (("w-tail", "127.0.0.1:1", LayerRange(4, 6)),)}, "nothing was dialled"),
        ({"downstream": ()}, "downstream hops"),
        ({"opener": "w-tail"}, "the hop before"),
    ],
)
def test_anything_the_ticket_does_not_say_is_refused(changes: dict[str, object], match: str) -> None:
    with pytest.raises(TicketRefused, match=match):
        check_opening(TICKET, at(1, **changes), now_unix_s=NOW, secured=True)


def test_only_the_holder_opens_the_head_and_an_unsecured_shard_checks_no_sender() -> None:
    with pytest.raises(TicketRefused, match="its holder"):
        check_opening(TICKET, at(0, opener="w-rogue"), now_unix_s=NOW, secured=True)
    assert check_opening(TICKET, at(0, opener=None), now_unix_s=NOW, secured=False) == 0


def test_an_expired_ticket_opens_nothing_past_the_clock_skew() -> None:
    assert check_opening(TICKET, at(1), now_unix_s=NOW + 60 + CLOCK_SKEW_S, secured=True) == 1
    with pytest.raises(TicketRefused, match="expired"):
        check_opening(TICKET, at(1), now_unix_s=NOW + 61 + CLOCK_SKEW_S, secured=True)


def test_a_ticket_for_any_request_of_the_session_and_the_granted_life() -> None:
    anyone = replace(TICKET, request_id=None)
    assert check_opening(anyone, at(1, request_id="r-9"), now_unix_s=NOW, secured=True) == 1
    assert granted_seconds(0) == granted_seconds(float("nan")) > 0
    assert granted_seconds(10**9) < 10**9


def test_a_node_behind_nat_opens_at_its_relayed_address_whichever_relay_carries_it() -> None:
    """Issue 33: the middle is reached at ``w-mid@RELAY``; its shard knows only its own address."""
    relayed = replace(TICKET, hops=(HOPS[0], replace(HOPS[1], address="w-mid@relay.example:7090"), HOPS[2]))
    middle = at(1, downstream=(("w-tail", HOPS[2].address, HOPS[2].layers),))
    assert check_opening(relayed, middle, now_unix_s=NOW, secured=True) == 1
    elsewhere = replace(relayed, hops=(HOPS[0], replace(HOPS[1], address="w-mid@other.example:7090"), HOPS[2]))
    assert check_opening(elsewhere, middle, now_unix_s=NOW, secured=True) == 1
    for address in ("w-head@relay.example:7090", "w-mid@", "w-mid@relay.example"):
        foreign = replace(relayed, hops=(HOPS[0], replace(HOPS[1], address=address), HOPS[2]))
        with pytest.raises(TicketRefused, match="this shard is at"):
            check_opening(foreign, middle, now_unix_s=NOW, secured=True)
