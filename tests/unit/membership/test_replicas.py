"""``--tracker a,b,c``: parsing the list, and the order in which a client moves between replicas."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from meshnet.cli.arguments import StatusArguments
from meshnet.core.addresses import dialable_address, parse_address_list, require_loopback
from meshnet.core.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, StorageUnavailable, Unreachable
from meshnet.core.layers import LayerRange
from meshnet.core.swarm_options import SwarmArguments
from meshnet.fetch.fetcher import FetchConfig
from meshnet.membership.replicas import (
    RETRIED_ON_NEXT_REPLICA,
    Failure,
    ReplicaRing,
    RetryBudget,
    classify,
    replica_order,
)
from meshnet.membership.tracker_failover import channel_options
from meshnet.node.artifact_server import SeedConfig
from meshnet.relay.config import RelayConfig
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
    moved = []
    for _ in range(3):
        assert ring.failed(ring.position(), Failure.GONE)
        moved.append(ring.current)
    assert moved == [1, 2, 0]  # in order, wrapping around


def test_a_loss_already_moved_past_does_not_move_the_ring_again() -> None:
    ring = ReplicaRing("a:1,b:1,c:1")
    # Two calls in flight on replica 0 both fail: the client moves once, to 1, not on to 2.
    at = ring.position()
    assert ring.failed(at, Failure.GONE) and not ring.failed(at, Failure.GONE)
    assert ring.current == 1


def test_a_stale_failure_after_the_ring_wrapped_back_moves_nothing() -> None:
    ring = ReplicaRing("a:1,b:1")
    long_call = ring.position()  # a watch opened on 0
    ring.failed(ring.position(), Failure.GONE)  # 0 -> 1
    ring.failed(ring.position(), Failure.GONE)  # 1 -> 0: back on the long call's replica
    assert ring.current == long_call.index
    assert not ring.failed(long_call, Failure.GONE)  # its failure is old news
    assert ring.current == 0


def test_deadlines_move_only_after_strikes_in_a_row() -> None:
    ring = ReplicaRing("a:1,b:1", slow_strikes=3)
    assert not ring.failed(ring.position(), Failure.SLOW)
    assert not ring.failed(ring.position(), Failure.SLOW)
    ring.answered(ring.position())  # an answer forgives them
    assert not ring.failed(ring.position(), Failure.SLOW)
    assert not ring.failed(ring.position(), Failure.SLOW)
    assert ring.failed(ring.position(), Failure.SLOW) and ring.current == 1


def test_an_answered_error_never_moves() -> None:
    ring = ReplicaRing("a:1,b:1", slow_strikes=1)
    assert not ring.failed(ring.position(), Failure.ANSWERED) and ring.current == 0


def test_a_single_tracker_stays_put() -> None:
    ring = ReplicaRing("a:1")
    assert not ring.failed(ring.position(), Failure.GONE) and ring.current == 0 and len(ring) == 1


THREE = ("10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070")
IDS = [f"w-{index:05}" for index in range(3_000)]
SPREAD_BOUND = 0.10
"""Each replica's share of 3,000 clients is within 10% of an even share: a fair draw's standard
deviation there is about 26 clients (0.9%), so the bound fails only for a skewed hash."""


def test_clients_spread_evenly_over_three_replicas() -> None:
    firsts = Counter(replica_order(node, THREE)[0] for node in IDS)
    even = len(IDS) / len(THREE)
    assert sorted(firsts) == [0, 1, 2]
    assert all(abs(count - even) <= SPREAD_BOUND * even for count in firsts.values()), firsts


def test_a_lost_replicas_clients_spread_over_the_others() -> None:
    # Not all onto the next listed one: each moves to its own second choice.
    seconds = Counter(replica_order(node, THREE)[1] for node in IDS if replica_order(node, THREE)[0] == 0)
    even = sum(seconds.values()) / 2
    assert sorted(seconds) == [1, 2]
    assert all(abs(count - even) <= SPREAD_BOUND * even for count in seconds.values()), seconds


def test_every_order_names_each_replica_once() -> None:
    assert all(sorted(replica_order(node, THREE)) == [0, 1, 2] for node in IDS[:300])


def test_one_replica_is_always_first() -> None:
    assert {replica_order(node, ("a:1",)) for node in IDS[:300]} == {(0,)}


def test_the_same_id_gets_the_same_order_in_another_process() -> None:
    """Stable across processes: Python's own ``hash`` of a str is salted per process and would fail."""
    program = (
        "import json, sys; from meshnet.membership.replicas import replica_order; "
        "print(json.dumps([replica_order(n, sys.argv[2:]) for n in sys.argv[1].split()]))"
    )
    ids = IDS[:50]
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", program, " ".join(ids), *THREE],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        assert [tuple(order) for order in json.loads(out)] == [replica_order(node, THREE) for node in ids]


def test_removing_a_replica_moves_only_its_own_clients() -> None:
    """Rendezvous hashing's point (a hash modulo the count would move about two thirds), by
    address: the others keep their replica, the lost one's land on their second choice."""
    two = (THREE[0], THREE[2])
    for node in IDS:
        before = [THREE[index] for index in replica_order(node, THREE)]
        after = two[replica_order(node, two)[0]]
        assert after == (before[1] if before[0] == THREE[1] else before[0]), node


def test_the_list_order_does_not_change_a_clients_replica() -> None:
    reversed_list = tuple(reversed(THREE))
    assert all(
        THREE[replica_order(node, THREE)[0]] == reversed_list[replica_order(node, reversed_list)[0]]
        for node in IDS[:300]
    )


def test_a_keyed_ring_starts_at_its_first_choice_and_walks_its_own_order() -> None:
    node = next(node for node in IDS if replica_order(node, THREE)[0] != 0)  # not the first listed
    ring = ReplicaRing(",".join(THREE), client_key=node)
    order = replica_order(node, THREE)
    assert ring.current == order[0]
    visited = [ring.current]
    for _ in range(3):
        assert ring.failed(ring.position(), Failure.GONE)
        visited.append(ring.current)
    assert visited == [*order, order[0]]  # wrapping around


def test_an_unkeyed_ring_keeps_the_listed_order() -> None:
    assert ReplicaRing(",".join(THREE)).order == (0, 1, 2)


@pytest.mark.parametrize(
    ("status", "code", "error", "failure"),
    [
        (grpc.StatusCode.UNAVAILABLE, None, Unreachable("refused"), Failure.GONE),
        (grpc.StatusCode.CANCELLED, None, Unreachable("server stopped"), Failure.GONE),
        (grpc.StatusCode.UNAVAILABLE, "storage_unavailable", StorageUnavailable("disk"), Failure.GONE),
        (grpc.StatusCode.DEADLINE_EXCEEDED, None, DeadlineExceeded("slow"), Failure.SLOW),
        # The replica's own errors, with metadata: answers, whatever their status.
        (grpc.StatusCode.DEADLINE_EXCEEDED, "deadline_exceeded", DeadlineExceeded("mine"), Failure.ANSWERED),
        (grpc.StatusCode.UNAVAILABLE, "no_route", Unreachable("no route"), Failure.ANSWERED),
        (grpc.StatusCode.CANCELLED, "cancelled", Unreachable("cancelled"), Failure.ANSWERED),
        (grpc.StatusCode.INTERNAL, None, Unreachable("bug"), Failure.ANSWERED),
    ],
)
def test_only_a_gone_replica_is_lost(
    status: grpc.StatusCode, code: str | None, error: Exception, failure: Failure
) -> None:
    assert classify(status, code, error) is failure  # type: ignore[arg-type]


def test_the_retry_budget_allows_about_a_tenth_of_calls_once_spent() -> None:
    budget = RetryBudget(ratio=0.1, max_tokens=10.0)
    retried = 0
    for _ in range(1_000):
        budget.earn()
        retried += budget.spend()
    # 10 to start with, then one per ten calls.
    assert 105 <= retried <= 110


def test_several_replicas_turn_grpc_retries_off() -> None:
    assert ("grpc.enable_retries", 0) in channel_options(2)
    assert ("grpc.enable_retries", 1) in channel_options(1)
    assert not any(key == "grpc.service_config" for key, _ in channel_options(2))


def test_every_retried_call_is_a_tracker_call() -> None:
    """A name misspelt here would silently never be retried."""
    methods = {
        name
        for stub in (services.TrackerStub, services.SwarmStub, services.SwarmStatusStub, services.ArtifactDirectoryStub)
        for name in _methods_of(stub)
    }
    assert set(RETRIED_ON_NEXT_REPLICA) <= methods
    # Weighed as it arrives: a second copy would count one measurement twice.
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


@pytest.mark.parametrize(
    "make",
    [
        lambda tracker: RelayConfig(tracker=tracker),
        lambda tracker: SeedConfig(Path("published"), tracker=tracker),
        lambda tracker: FetchConfig("model", LayerRange(0, 1), tracker, Path("data")),
        lambda tracker: StatusArguments(tracker=tracker),
        lambda tracker: SwarmArguments("revoke", "node-1", tracker=tracker),
    ],
)
def test_every_config_checks_its_tracker_list_when_built(make: Callable[[str], object]) -> None:
    """Before anything else runs: a relay or seed given --join would otherwise spend a one-use
    invite first and only then find the list mistyped."""
    make("127.0.0.1:7070,127.0.0.1:7071")
    with pytest.raises(InvalidArgument):
        make("127.0.0.1:7070,,127.0.0.1:7071")
