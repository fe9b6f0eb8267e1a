"""The reachability decisions, as pure functions: what the tracker registers, whether a node
attaches to a relay, what status says."""

from __future__ import annotations

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId
from meshnet.core.reachability import (
    PRIVATE_WORDS,
    check_declared,
    check_reachability,
    check_relayed_owner,
    describe,
    is_routable,
    needs_dial_back,
    registered_reachability,
    wants_relay,
)

DIRECT = "10.0.0.5:7000"
RELAYED = "w-home@relay.example:7400"


@pytest.mark.parametrize(
    ("address", "declared", "answered", "expected"),
    [
        (DIRECT, "auto", True, "public"),
        (DIRECT, "auto", False, "private"),  # no answer: registered, never routed (was: refused)
        (DIRECT, "public", False, "private"),  # a claim is not a proof
        (DIRECT, "private", None, "private"),
        (DIRECT, "private", True, "private"),  # the node knows its NAT better than the tracker
        (DIRECT, "auto", None, "public"),  # an unsecured tracker takes the node's word
        (RELAYED, "private", True, "relayed"),
        (RELAYED, "auto", True, "relayed"),
        (RELAYED, "private", False, "private"),  # the relay lost it: nobody reaches it
        (RELAYED, "private", None, "relayed"),
    ],
)
def test_the_tracker_registers_what_the_dial_back_proved(
    address: str, declared: str, answered: bool | None, expected: str
) -> None:
    assert registered_reachability(address, check_declared(declared), answered) == expected


def test_a_direct_address_declared_private_is_never_dialled_back_and_a_relayed_one_always() -> None:
    assert not needs_dial_back(DIRECT, "private")
    assert needs_dial_back(DIRECT, "auto") and needs_dial_back(DIRECT, "public")
    assert needs_dial_back(RELAYED, "private")


def test_only_a_private_node_is_unroutable() -> None:
    assert [is_routable(value) for value in ("public", "relayed", "private")] == [True, True, False]


@pytest.mark.parametrize(
    ("declared", "told", "attach"),
    [
        ("private", None, True),
        ("private", "public", True),
        ("auto", None, False),
        ("auto", "public", False),
        ("auto", "private", True),
        ("auto", "relayed", False),
        ("public", "private", False),
    ],
)
def test_a_node_attaches_to_a_relay_when_it_is_private_by_word_or_by_dial_back(
    declared: str, told: str | None, attach: bool
) -> None:
    assert wants_relay(check_declared(declared), None if told is None else check_reachability(told)) is attach


def test_a_relayed_address_is_only_its_own_nodes_to_register() -> None:
    check_relayed_owner(RELAYED, NodeId("w-home"))
    check_relayed_owner(DIRECT, NodeId("w-home"))
    with pytest.raises(InvalidArgument, match="names node w-home"):
        check_relayed_owner(RELAYED, NodeId("w-thief"))


def test_values_off_the_wire_are_checked_and_empty_means_the_old_default() -> None:
    assert check_declared("") == "auto" and check_reachability("") == "public"
    with pytest.raises(InvalidArgument, match="reachability must be one of"):
        check_declared("relayed")  # the tracker's verdict, not something a node may declare
    with pytest.raises(InvalidArgument):
        check_reachability("hidden")


def test_status_words_name_the_relay_and_the_unroutable_private_node() -> None:
    assert describe("public", DIRECT) == "public"
    assert describe("relayed", RELAYED) == "relayed via relay.example:7400"
    assert describe("private", DIRECT) == PRIVATE_WORDS == "private: behind NAT, no relay attached"
