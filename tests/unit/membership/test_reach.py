"""A node's current address as its relay attachment moves (``membership.reach``)."""

from __future__ import annotations

from meshnet.membership.reach import Reach

RELAYS = ("r1:7400", "r2:7400")


def test_a_declared_private_node_attaches_at_once_and_registers_where_its_relay_says() -> None:
    reach = Reach("10.0.0.5:7000", "private", RELAYS)
    assert reach.wants_relay and (reach.address, reach.declaring) == ("10.0.0.5:7000", "private")
    reach.moved("w-home@r1:7400")
    assert reach.changed.is_set() and reach.address == "w-home@r1:7400"
    reach.changed.clear()
    reach.moved("w-home@r1:7400")  # the same relay again: nothing to register
    assert not reach.changed.is_set()
    reach.moved(None)
    assert reach.changed.is_set() and reach.address == "10.0.0.5:7000"


def test_an_auto_node_attaches_only_once_the_tracker_found_it_private_and_then_stays_private() -> None:
    reach = Reach("10.0.0.5:7000", "auto", RELAYS)
    assert not reach.wants_relay and reach.declaring == "auto"
    reach.registered("public")
    assert not reach.wants_relay
    reach.registered("private")
    assert reach.wants_relay and reach.declaring == "private"  # its own address is not dialled again
    reach.moved("w-home@r1:7400")
    reach.registered("relayed")
    reach.moved(None)
    assert reach.wants_relay and reach.declaring == "private"


def test_a_private_verdict_at_a_relayed_address_is_not_taken_for_nat() -> None:
    reach = Reach("10.0.0.5:7000", "auto", RELAYS)
    reach.moved("w-home@r1:7400")
    reach.registered("private")  # the relay did not carry the dial-back: not about its own address
    assert not reach.wants_relay


def test_without_relays_or_declared_public_nothing_attaches() -> None:
    assert not Reach("10.0.0.5:7000", "private").wants_relay
    public = Reach("10.0.0.5:7000", "public", RELAYS)
    public.registered("private")
    assert not public.wants_relay
