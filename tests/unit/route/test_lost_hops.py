"""Which lost hops a failover avoids (``route.lost_hops``), against a scripted tracker: every lost
hop is excluded first (a replica is taken at once); with no route left a relayed node lost with
its relay is taken again once it registered at another relay, never at the dead one, and the
failover ends in ``NoRoute`` once it does not come back in time."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from meshnet.core.errors import NoRoute
from meshnet.core.events import RouteHop
from meshnet.core.ids import NodeId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeCapability
from meshnet.core.tracking import Route
from meshnet.route.lost_hops import (
    RELAY_MOVE_POLL_S,
    RELAY_MOVE_WAIT_S,
    excluded,
    replacement_route,
    revisits_a_lost_hop,
)

CAPABILITY = NodeCapability(64, 8, 64, 1 << 20, 8, 1)
HOME = NodeId("w-home")


def route(*addresses: str) -> Route:
    nodes = [address.partition("@")[0] if "@" in address else f"n{i}" for i, address in enumerate(addresses)]
    hops = tuple(
        RouteHop(NodeId(node), address, LayerRange(2 * i, 2 * i + 2), CAPABILITY)
        for i, (node, address) in enumerate(zip(nodes, addresses, strict=True))
    )
    return Route(hops, 5, "tiny", "Q8_0", "rcp-x", 2 * len(hops), 1.0)


class Tracker:
    """Answers each ChooseRoute with the next scripted reply (a route, or NoRoute)."""

    def __init__(self, replies: Sequence[Route | None]) -> None:
        self.replies = list(replies)
        self.asked: list[frozenset[NodeId]] = []

    async def __call__(self, exclude: frozenset[NodeId]) -> Route:
        self.asked.append(exclude)
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        if reply is None or any(hop.node_id in exclude for hop in reply.hops):
            raise NoRoute("no route")
        return reply


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.5  # each look costs half a second of the wait
        return self.now


LOST = {HOME: "w-home@r1:7400", NodeId("n2"): "10.0.0.9:7000"}


def test_a_relayed_hop_is_avoided_only_at_the_address_it_was_lost_at() -> None:
    assert excluded(LOST, relayed_too=True) == {HOME, "n2"}
    assert excluded(LOST, relayed_too=False) == {"n2"}
    assert revisits_a_lost_hop(route("a:1", "w-home@r1:7400"), LOST)
    assert not revisits_a_lost_hop(route("a:1", "w-home@r2:7400"), LOST)


async def test_the_failover_takes_the_node_again_once_it_registered_at_another_relay() -> None:
    stale, moved = route("a:1", "w-home@r1:7400"), route("a:1", "w-home@r2:7400")
    tracker = Tracker([stale, stale, moved])  # strict: no route without the node; then it moves
    assert await replacement_route(tracker, LOST, clock=Clock(), poll_s=0.0) == moved
    assert tracker.asked == [frozenset({HOME, NodeId("n2")})] + [frozenset({NodeId("n2")})] * 2


async def test_a_replica_of_a_lost_relayed_node_is_taken_at_once_with_one_ask() -> None:
    spare, stale = route("a:1", "b:1"), route("a:1", "w-home@r1:7400")

    async def tracker(exclude: frozenset[NodeId]) -> Route:
        asked.append(exclude)
        return spare if HOME in exclude else stale  # it still lists the node at the dead relay

    asked: list[frozenset[NodeId]] = []
    assert await replacement_route(tracker, LOST, clock=Clock(), poll_s=0.0) == spare
    assert asked == [{HOME, "n2"}]  # no wait for the relay move when another node serves the range


async def test_a_node_between_two_relays_is_waited_for_and_one_with_none_left_ends_in_no_route() -> None:
    moved = route("a:1", "w-home@r2:7400")
    tracker = Tracker([None, None, moved])  # registered private for a moment, then at the next relay
    assert await replacement_route(tracker, LOST, clock=Clock(), poll_s=0.0) == moved
    tracker = Tracker([None])
    with pytest.raises(NoRoute):
        await replacement_route(tracker, LOST, wait_s=2.0, clock=Clock(), poll_s=0.0)
    assert tracker.asked == [frozenset({HOME, NodeId("n2")})] + [frozenset({NodeId("n2")})] * 4


async def test_with_no_relay_left_the_failover_gives_up_within_its_wait_asking_a_few_times() -> None:
    tracker = Tracker([None])
    started = time.monotonic()
    with pytest.raises(NoRoute):
        await replacement_route(tracker, LOST, wait_s=0.3, poll_s=0.1)
    assert time.monotonic() - started < 0.5 and len(tracker.asked) <= 4
    # The bound: a silent relay is found by keepalive (~2.5 s), then this wait, within 5 s.
    assert RELAY_MOVE_WAIT_S + 2.5 < 5.0 and RELAY_MOVE_WAIT_S / RELAY_MOVE_POLL_S <= 10


async def test_direct_hops_alone_are_asked_once_as_before() -> None:
    tracker = Tracker([route("a:1", "b:1")])
    await replacement_route(tracker, {NodeId("n2"): "10.0.0.9:7000"}, clock=Clock(), poll_s=0.0)
    assert tracker.asked == [frozenset({NodeId("n2")})]
    tracker = Tracker([None])
    with pytest.raises(NoRoute):
        await replacement_route(tracker, {NodeId("n2"): "10.0.0.9:7000"}, clock=Clock(), poll_s=0.0)
    assert len(tracker.asked) == 1
