"""Private and relayed nodes in the node table and in routes (fake clock, pure planner).

A private node (nobody can dial it) is listed but never routed, probed or given an address
from another node; a relayed node (``NODE@RELAY``) is routed, its seams costed by the round trip
measured through its relay, and a direct node wins any tie with it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from manual_clock import ManualClock
from test_tracker_registry import Registry, route_for
from tracker_samples import MODEL, N_LAYERS, registration, view

from meshnet.core.errors import NoRoute
from meshnet.core.ids import NodeId, SessionId
from meshnet.core.swarm_status import coverage, judge_health
from meshnet.core.tracking import NodeLoad, RouteQuery
from meshnet.tracker.route_costs import DEFAULT_COSTS, NodeView, seam_cost_ms
from meshnet.tracker.routing import choose_model_route
from meshnet.tracker.status_service import node_table


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1000.0)


@pytest.fixture
def registry(clock: ManualClock) -> Registry:
    return Registry(clock)


def relayed_view(node_id: str, start: int, stop: int, relay: str = "relay.local:7400", **kwargs: float) -> NodeView:
    direct = view(node_id, start, stop, **kwargs)  # type: ignore[arg-type]
    return replace(direct, record=replace(direct.record, address=f"{node_id}@{relay}"))


def test_a_private_node_is_listed_but_never_routed_probed_or_counted_as_cover(
    registry: Registry, clock: ManualClock
) -> None:
    head = registry.join(registration(0, 10, address="h:1"))
    hidden = registry.register(registration(10, 20, address="10.9.9.9:7000"), NodeId("w-hidden"), "private")
    assert [entry.reachability for entry in registry.entries()] == ["public", "private"]
    assert registry.probe_targets(head) == () and registry.probe_targets(hidden) == ()
    with pytest.raises(NoRoute, match="layers 10:20 have no live shard"):
        route_for(registry)
    table = node_table(registry)
    private = next(node for node in table.nodes if node.node_id == hidden)
    assert private.reachability_words == "private: behind NAT, no relay attached"
    assert [c.complete for c in coverage(table.nodes)] == [False]
    assert judge_health(MODEL, table).status == "no_route"
    assert registry.heartbeat(hidden, NodeLoad(free_sessions=8))  # it still beats: it is known


def test_a_private_registration_evicts_nobody_at_its_address_and_a_proven_one_does(registry: Registry) -> None:
    victim = registry.join(registration(0, N_LAYERS, address="10.0.0.5:7000"))
    epoch = registry.epoch
    registry.register(registration(0, N_LAYERS, address="10.0.0.5:7000"), NodeId("w-thief"), "private")
    assert route_for(registry) == [victim] and registry.epoch == epoch
    assert registry.latency_table() == {} and registry.get(victim) is not None
    registry.register(registration(0, N_LAYERS, address="10.0.0.5:7000"), NodeId("w-new"), "public")
    assert registry.get(victim) is None and route_for(registry) == ["w-new"]
    assert registry.get(NodeId("w-thief")) is not None  # the private claim held nothing to lose


def test_a_relayed_node_moving_to_another_relay_moves_its_sessions_and_expiry_drops_it(
    registry: Registry, clock: ManualClock
) -> None:
    head = registry.join(registration(0, 10, address="h:1"))
    home = NodeId("w-home")
    registry.register(registration(10, 20, address="w-home@r1:7400"), home, "relayed")
    assert registry.probe_targets(head) == ("w-home@r1:7400",)
    assert route_for(registry, "s1") == [head, home]
    epoch = registry.epoch
    registry.register(registration(10, 20, address="w-home@r2:7400"), home, "relayed")  # re-attached
    assert registry.epoch > epoch and registry.probe_targets(head) == ("w-home@r2:7400",)
    route = registry.choose_route(route_query("s1"))
    assert [hop.address for hop in route.hops] == ["h:1", "w-home@r2:7400"]
    registry.register(registration(10, 20, address="10.9.9.9:7000"), home, "private")  # no relay left
    assert registry.probe_targets(head) == ()
    with pytest.raises(NoRoute):  # a route through a node no relay carries
        route_for(registry, "s1")
    registry.register(registration(10, 20, address="w-home@r1:7400"), home, "relayed")
    for _ in range(3):
        clock.advance(2.0)
        registry.heartbeat(head, NodeLoad(free_sessions=8))
    assert registry.get(home) is None  # its relay is gone and so are its heartbeats
    with pytest.raises(NoRoute):
        route_for(registry, "s1")


def route_query(session: str) -> RouteQuery:
    return RouteQuery(model=MODEL, session_id=SessionId(session))


def test_a_relayed_seam_is_costed_by_the_round_trip_measured_through_the_relay(registry: Registry) -> None:
    head = registry.join(registration(0, 10, address="h:1"))
    direct = registry.join(registration(10, 20, address="d:1", decode_tokens_per_s=100.0))
    relayed = NodeId("w-home")
    registry.register(registration(10, 20, address="w-home@r1:7400", decode_tokens_per_s=120.0), relayed, "relayed")
    assert set(registry.probe_targets(head)) == {"d:1", "w-home@r1:7400"}
    rtts = (("d:1", 30.0), ("w-home@r1:7400", 4.0))  # the relay is near, the direct node is not
    registry.heartbeat(head, NodeLoad(free_sessions=8, peer_rtt_ms=rtts))
    assert registry.latency_table() == {(head, direct): 15.0, (head, relayed): 2.0}
    assert route_for(registry) == [head, relayed]
    registry.heartbeat(head, NodeLoad(free_sessions=8, peer_rtt_ms=(("d:1", 1.0), ("w-home@r1:7400", 40.0))))
    assert route_for(registry) == [head, direct]


def test_an_unmeasured_relayed_seam_costs_two_legs_and_the_relay_crossing() -> None:
    a, b = NodeId("a"), NodeId("b")
    direct = seam_cost_ms(a, b, {})
    relayed = seam_cost_ms(a, b, {}, relayed=True)
    assert relayed - direct == DEFAULT_COSTS.default_latency_ms + DEFAULT_COSTS.relay_crossing_ms
    assert seam_cost_ms(a, b, {(a, b): 3.0}, relayed=True) == seam_cost_ms(a, b, {(a, b): 3.0})


@settings(max_examples=200, deadline=None)
@given(
    rtt_ms=st.floats(min_value=0.0, max_value=500.0),
    rate=st.floats(min_value=1.0, max_value=5000.0),
    relayed_first=st.booleans(),
)
def test_a_direct_hop_wins_every_tie_with_a_relayed_one(rtt_ms: float, rate: float, relayed_first: bool) -> None:
    """Same speed, same measured round trip: whatever the ids or the order, the direct node."""
    head = view("head", 0, 10)
    names = ("aaa", "zzz") if relayed_first else ("zzz", "aaa")
    relayed = relayed_view(names[0], 10, 20, rate=rate)
    direct = view(names[1], 10, 20, rate=rate)
    latency = {(head.node_id, relayed.node_id): rtt_ms / 2, (head.node_id, direct.node_id): rtt_ms / 2}
    plan = choose_model_route([head, relayed, direct], MODEL, latency_ms=latency)
    assert [hop.node_id for hop in plan.hops] == ["head", direct.node_id]


@settings(max_examples=200, deadline=None)
@given(tenths=st.lists(st.integers(min_value=0, max_value=2000), min_size=3, max_size=3))
def test_the_route_takes_the_fastest_measured_seam_relayed_or_not(tenths: list[int]) -> None:
    rtts = [tenth / 10 for tenth in tenths]  # a measurement's resolution: no sums lost to rounding
    head = view("head", 0, 10)
    tails = [relayed_view("r1", 10, 20), view("d1", 10, 20), relayed_view("r2", 10, 20, relay="other:7400")]
    latency = {(head.node_id, tail.node_id): rtt / 2 for tail, rtt in zip(tails, rtts, strict=True)}
    plan = choose_model_route([head, *tails], MODEL, latency_ms=latency)
    best = min(rtts)
    chosen = next(tail for tail in tails if tail.node_id == plan.hops[1].node_id)
    assert latency[(head.node_id, chosen.node_id)] == best / 2
    if rtts[1] == best:
        assert chosen.node_id == "d1"
