"""``dialable_address``: a wildcard bind becomes the address of the interface toward the peer, or
a refusal naming the fix; anything else passes unchanged. The route lookup is injected here (the
real one, a UDP socket connect, runs in tests/integration/test_dialable_addresses.py)."""

from __future__ import annotations

import socket

import pytest

from meshnet.core.addresses import DEFAULT_ROUTE_PROBE, dialable_address, is_unspecified_host
from meshnet.core.errors import FailedPrecondition


class Routes:
    """A routing table: the source address toward each known target; no route to any other."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, int]] = []

    def __call__(self, target: str, family: int) -> str:
        self.asked.append((target, family))
        if target not in self.answers:
            raise OSError(101, "Network is unreachable")
        return self.answers[target]


@pytest.mark.parametrize("address", ["10.1.2.3:7000", "node-b.lan:7000", "[2001:db8::7]:7000", "127.0.0.1:1"])
def test_a_dialable_address_passes_unchanged_and_nothing_is_looked_up(address: str) -> None:
    source_of = Routes({})
    assert dialable_address(address, toward="10.0.0.1:7070", source_of=source_of) == address
    assert source_of.asked == []


def test_a_wildcard_takes_the_address_of_the_interface_toward_the_tracker() -> None:
    source_of = Routes({"10.0.0.1": "10.0.0.9", "tracker.lan": "10.0.0.8"})
    assert dialable_address("0.0.0.0:7000", toward="10.0.0.1:7070", source_of=source_of) == "10.0.0.9:7000"
    assert dialable_address("0.0.0.0:7000", toward="tracker.lan:7070", source_of=source_of) == "10.0.0.8:7000"
    assert source_of.asked == [("10.0.0.1", socket.AF_INET), ("tracker.lan", socket.AF_INET)]


def test_an_ipv6_wildcard_asks_over_ipv6_and_brackets_the_answer() -> None:
    source_of = Routes({"2001:db8::1": "2001:db8::2"})
    assert dialable_address("[::]:7000", toward="[2001:db8::1]:7070", source_of=source_of) == "[2001:db8::2]:7000"


def test_without_a_peer_the_default_route_decides() -> None:
    source_of = Routes({DEFAULT_ROUTE_PROBE[socket.AF_INET]: "192.168.1.20"})
    assert dialable_address("0.0.0.0:7101", source_of=source_of) == "192.168.1.20:7101"


@pytest.mark.parametrize("answers", [{}, {"10.0.0.1": "0.0.0.0"}])
def test_no_route_or_a_wildcard_answer_is_refused_naming_the_flag(answers: dict[str, str]) -> None:
    with pytest.raises(FailedPrecondition, match=r"0\.0\.0\.0:7000 binds every interface .*give --advertise HOST:PORT"):
        dialable_address("0.0.0.0:7000", toward="10.0.0.1:7070", source_of=Routes(answers))


@pytest.mark.parametrize(
    ("host", "wildcard"), [("0.0.0.0", True), ("[::]", True), ("", True), ("::1", False), ("a.b", False)]
)
def test_is_unspecified_host(host: str, wildcard: bool) -> None:
    assert is_unspecified_host(host) is wildcard


def test_an_ipv6_wildcard_reaches_an_ipv4_tracker_over_ipv4() -> None:
    # "::" is dual stack: a worker bound there and a tracker on an IPv4 address must not be
    # refused because the tracker has no IPv6 address (the real route lookup, on loopback).
    assert dialable_address("[::]:7000", toward="127.0.0.1:7070") == "127.0.0.1:7000"
