"""``--tracker a,b,c``: parsing the list, and the order in which a client moves between replicas."""

from __future__ import annotations

import grpc
import pytest

from meshnet.core.addresses import dialable_address, parse_address_list, require_loopback
from meshnet.core.errors import FailedPrecondition, InvalidArgument
from meshnet.membership.replicas import RETRIED_ON_NEXT_REPLICA, ReplicaRing
from meshnet.wire import services


def test_one_address_is_a_list_of_one() -> None:
    assert parse_address_list("127.0.0.1:7070") == ("127.0.0.1:7070",)


def test_a_list_keeps_its_order_and_drops_spaces() -> None:
    assert parse_address_list("b:7070, a:7070 ,[::1]:7071") == ("b:7070", "a:7070", "[::1]:7071")


@pytest.mark.parametrize(
    "text", ["", ",", "a:7070,", ",a:7070", "a:7070,,b:7070", "a", "a:0", "a:70000", ":7070", "a:x", "a:7070,a:7070"]
)
def test_a_malformed_list_is_refused_with_a_typed_error(text: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_address_list(text)


def test_insecure_checks_every_replica_of_a_list() -> None:
    require_loopback(("127.0.0.1:7070,localhost:7071",))
    with pytest.raises(FailedPrecondition):
        require_loopback(("127.0.0.1:7070,10.0.0.5:7070",))


def test_the_ring_sticks_to_the_first_until_it_is_lost() -> None:
    ring = ReplicaRing("a:1,b:1,c:1")
    assert ring.current == 0
    assert [ring.lost(0), ring.lost(1), ring.lost(2)] == [1, 2, 0]  # in order, wrapping around
    assert ring.current == 0


def test_a_loss_already_moved_past_does_not_move_the_ring_again() -> None:
    ring = ReplicaRing("a:1,b:1,c:1")
    # Two calls in flight on replica 0 both fail: the client moves once, to 1, not on to 2.
    assert ring.lost(0) == 1
    assert ring.lost(0) == 1
    assert ring.current == 1


def test_a_single_tracker_stays_put() -> None:
    ring = ReplicaRing("a:1")
    assert ring.lost(0) == 0 and len(ring) == 1


def test_every_retried_call_is_a_tracker_call() -> None:
    """A name misspelt here would silently never be retried."""
    methods = {
        name
        for stub in (services.TrackerStub, services.SwarmStub, services.SwarmStatusStub, services.ArtifactDirectoryStub)
        for name in _methods_of(stub)
    }
    assert set(RETRIED_ON_NEXT_REPLICA) <= methods
    # Counted as they arrive: a second delivery would count twice.
    assert "ReportSessionTokens" not in RETRIED_ON_NEXT_REPLICA
    assert "ReportRouteTiming" not in RETRIED_ON_NEXT_REPLICA


def _methods_of(stub: type) -> set[str]:
    with grpc.insecure_channel("127.0.0.1:1") as channel:  # never dialled: a stub only names methods
        return {name for name in vars(stub(channel)) if name[0].isupper()}


def test_a_malformed_list_is_refused_before_any_channel_opens() -> None:
    with pytest.raises(InvalidArgument):
        ReplicaRing("a:1,,b:1")


def test_a_wildcard_bind_takes_its_address_from_the_route_to_the_first_tracker() -> None:
    asked: list[str] = []

    def source_of(target: str, family: int) -> str:
        asked.append(target)
        return "10.0.0.9"

    bound = dialable_address("0.0.0.0:7001", toward="10.0.0.1:7070,10.0.0.2:7070", source_of=source_of)
    assert bound == "10.0.0.9:7001" and asked == ["10.0.0.1"]
