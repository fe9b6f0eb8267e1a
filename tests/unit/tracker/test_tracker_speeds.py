"""Node speeds are believed from what routes measured, not from what nodes claim (issue 29, finding 2).

Pure functions, no model: the estimator (``tracker.speeds``), the belief it feeds
(``tracker.claims.believed_views``) and the route the planner then picks.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from manual_clock import ManualClock
from tracker_samples import MODEL, RECIPE, registration, view

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId
from meshnet.core.tracking import RouteQuery, RouteTiming
from meshnet.tracker.claims import NEWCOMER_EDGE, believed_views
from meshnet.tracker.registry import NodeRegistry
from meshnet.tracker.route_costs import NodeView, seam_cost_ms
from meshnet.tracker.routing import choose_model_route
from meshnet.tracker.speeds import SAMPLES_PER_ROUTE, RouteMeasure, RouteMeasurements, fit_hop_ms
from meshnet.tracker.status_service import node_table
from meshnet.wire.status_wire import node_table_from_proto, node_table_to_proto

SIX = replace(RECIPE, n_layers=6)
SEAM_MS = seam_cost_ms(NodeId("x"), NodeId("y"), {})
"""What the planner charges a seam no node measured."""


def node(node_id: str, start: int, stop: int, rate: float) -> NodeView:
    return view(node_id, start, stop, rate=rate, recipe=SIX)


def route(*hops: str, ms: float) -> RouteMeasure:
    return RouteMeasure(tuple(NodeId(hop) for hop in hops), ms)


def ids(*names: str) -> tuple[NodeId, ...]:
    return tuple(NodeId(name) for name in names)


def chosen(views: tuple[NodeView, ...], latency: dict[tuple[NodeId, NodeId], float] | None = None) -> tuple[str, ...]:
    return tuple(hop.node_id for hop in choose_model_route(views, MODEL, latency_ms=latency or {}).hops)


# --- the estimator ------------------------------------------------------------------------------


@pytest.mark.parametrize("prior", [(1.0, 1.0, 1.0), (0.01, 50.0, 3.0), (9.0, 0.001, 0.5)])
def test_routes_sharing_a_hop_fix_the_difference_of_the_others_whatever_the_start(
    prior: tuple[float, float, float],
) -> None:
    start = dict(zip(ids("a", "b", "c"), prior, strict=True))
    fitted = fit_hop_ms(start, [route("a", "c", ms=10.0), route("b", "c", ms=25.0)])
    assert fitted[NodeId("a")] + fitted[NodeId("c")] == pytest.approx(10.0, abs=1e-6)
    assert fitted[NodeId("b")] + fitted[NodeId("c")] == pytest.approx(25.0, abs=1e-6)
    assert fitted[NodeId("b")] - fitted[NodeId("a")] == pytest.approx(15.0, abs=1e-6)


def test_what_the_routes_leave_open_is_split_nearest_to_the_start() -> None:
    fitted = fit_hop_ms({NodeId("a"): 2.0, NodeId("c"): 2.0}, [route("a", "c", ms=10.0)])
    assert fitted == {NodeId("a"): pytest.approx(5.0), NodeId("c"): pytest.approx(5.0)}


def test_no_hop_is_believed_slower_than_its_route_nor_at_zero() -> None:
    fitted = fit_hop_ms({NodeId("a"): 100.0, NodeId("c"): 0.0}, [route("a", "c", ms=4.0)])
    assert fitted[NodeId("c")] > 0 and fitted[NodeId("a")] <= 4.0


def test_a_route_through_a_node_that_left_is_not_fitted() -> None:
    fitted = fit_hop_ms({NodeId("a"): 1.0}, [route("a", "gone", ms=50.0)])
    assert fitted == {NodeId("a"): 1.0}


def test_a_route_measures_the_median_of_its_recent_timings_and_is_forgotten_after_the_horizon() -> None:
    measurements = RouteMeasurements(horizon_s=60.0)
    hops = ids("a", "c")
    for ms in (10.0, 11.0, 500.0, 9.0, 10.5):  # one stalled request does not move it
        measurements.observe(RouteTiming(hops, ms, tokens=16), now=0.0)
    assert measurements.recent(now=59.0) == (RouteMeasure(hops, 10.5),)
    for ms in [20.0] * SAMPLES_PER_ROUTE:
        measurements.observe(RouteTiming(hops, ms, tokens=16), now=59.0)
    assert measurements.recent(now=60.0) == (RouteMeasure(hops, 20.0),)  # older timings left
    assert measurements.recent(now=119.0) == ()


def test_a_timing_is_a_checked_value() -> None:
    with pytest.raises(InvalidArgument):
        RouteTiming(ids("a", "a"), 1.0, tokens=4)
    with pytest.raises(InvalidArgument):
        RouteTiming(ids("a"), float("nan"), tokens=4)
    with pytest.raises(InvalidArgument):
        RouteTiming(ids("a"), 1.0, tokens=1)


# --- belief and route choice --------------------------------------------------------------------


def swarm(boast: float = 30.0) -> tuple[NodeView, ...]:
    """Two honest heads of the same layers (one claims 30x) and one tail."""
    return (node("honest", 0, 3, 100.0), node("boaster", 0, 3, boast * 100.0), node("tail", 3, 6, 100.0))


def test_a_boaster_measured_slow_loses_its_ranking() -> None:
    views = swarm()
    assert chosen(believed_views(views))[0] == "boaster"  # the claim alone wins (it is inside 32x)
    measured = [route("honest", "tail", ms=9.0 + SEAM_MS), route("boaster", "tail", ms=20.0 + SEAM_MS)]
    believed = {v.node_id: v.decode_tokens_per_s for v in believed_views(views, measured)}
    assert 1000.0 / believed[NodeId("boaster")] - 1000.0 / believed[NodeId("honest")] == pytest.approx(11.0)
    assert chosen(believed_views(views, measured)) == ("honest", "tail")


def test_a_measured_route_costs_what_it_measured_whatever_round_trips_its_nodes_report() -> None:
    views = swarm()
    lie = {(NodeId("boaster"), NodeId("tail")): 0.005}
    measured = [route("honest", "tail", ms=9.0 + SEAM_MS), route("boaster", "tail", ms=20.0 + SEAM_MS)]
    believed = believed_views(views, measured, latency_ms=lie)
    plan = choose_model_route(believed, MODEL, latency_ms=lie, exclude=frozenset({NodeId("honest")}))
    assert plan.ms_per_token == pytest.approx(20.0 + SEAM_MS)
    assert chosen(believed, lie) == ("honest", "tail")


@pytest.mark.parametrize("honest_route_ms", [9.0, 30.0])
def test_a_newcomer_is_believed_at_its_recipes_median_claim_or_just_ahead_of_its_measured_peer(
    honest_route_ms: float,
) -> None:
    views = swarm(boast=30.0)
    measured = [route("honest", "tail", ms=honest_route_ms + SEAM_MS)]
    believed = {v.node_id: v.decode_tokens_per_s for v in believed_views(views, measured)}
    peer = believed[NodeId("honest")]
    # Never its 3000 tok/s claim: the lower median claim (100 tok/s: 100, 3000 and 100 over 3
    # layers), or, when its measured peer is faster than that, just ahead of it: tried once.
    assert believed[NodeId("boaster")] == pytest.approx(max(100.0, peer / NEWCOMER_EDGE))
    assert chosen(believed_views(views, measured))[0] == "boaster"  # once: that request measures it


def test_an_honest_newcomer_replaces_a_measured_boaster() -> None:
    # The boaster got the first route and was measured slow; its honest peer, unmeasured, must win
    # the next one (a median of measured nodes would count the boaster and tie the two).
    views = swarm()  # each claims 10 ms per token but the boaster, which claims 0.33
    measured = [route("boaster", "tail", ms=30.0 + SEAM_MS)]
    assert chosen(believed_views(views, measured)) == ("honest", "tail")


def test_without_measurements_claims_are_believed_as_before() -> None:
    views = (node("fast", 0, 3, 1000.0), node("slow", 0, 3, 100.0), node("tail", 3, 6, 100.0))
    assert [v.decode_tokens_per_s for v in believed_views(views)] == [1000.0, 100.0, 100.0]


# --- the registry's record ----------------------------------------------------------------------


def test_the_registry_routes_by_the_timings_it_was_given_and_ignores_impossible_ones() -> None:
    registry = NodeRegistry(clock=ManualClock(1000.0), heartbeat_interval_s=2.0)
    honest = registry.register(registration(0, 10, address="h:1", decode_tokens_per_s=100), NodeId("honest"))
    boaster = registry.register(registration(0, 10, address="b:1", decode_tokens_per_s=3000), NodeId("boaster"))
    tail = registry.register(registration(10, 20, address="t:1", decode_tokens_per_s=100), NodeId("tail"))
    assert registry.choose_route(RouteQuery(model=MODEL)).node_ids == (boaster, tail)
    assert not registry.observe_route(RouteTiming((boaster,), 1.0, tokens=8))  # not a whole route
    assert not registry.observe_route(RouteTiming((boaster, NodeId("nobody")), 1.0, tokens=8))
    assert registry.observe_route(RouteTiming((boaster, tail), 40.0, tokens=8))
    assert registry.choose_route(RouteQuery(model=MODEL)).node_ids == (honest, tail)
    assert registry.observe_route(RouteTiming((honest, tail), 12.0, tokens=8))
    assert registry.choose_route(RouteQuery(model=MODEL)).node_ids == (honest, tail)


def test_the_node_table_shows_what_each_node_claims_and_what_it_is_routed_by() -> None:
    registry = NodeRegistry(clock=ManualClock(1000.0), heartbeat_interval_s=2.0)
    registry.register(registration(0, 10, address="h:1", decode_tokens_per_s=100), NodeId("honest"))
    registry.register(registration(0, 10, address="b:1", decode_tokens_per_s=3000), NodeId("boaster"))
    registry.register(registration(10, 20, address="t:1", decode_tokens_per_s=100), NodeId("tail"))
    assert registry.observe_route(RouteTiming(ids("boaster", "tail"), 40.0, tokens=8))
    table = node_table_from_proto(node_table_to_proto(node_table(registry)))
    shown = {node.node_id: (node.record.capability.decode_tokens_per_s, node.speed_measured) for node in table.nodes}
    assert shown == {"honest": (100, False), "boaster": (3000, True), "tail": (100, True)}
    routed = {node.node_id: node.routed_decode_tokens_per_s for node in table.nodes}
    assert routed["boaster"] == pytest.approx(1000.0 / ((40.0 - SEAM_MS) / 2))
    assert routed["honest"] == 100.0  # unmeasured: its claim, within the recipe's median


def test_the_version_moves_exactly_when_what_recent_returns_moves() -> None:
    # A route timed again that is already the last one and keeps its median changes nothing
    # the beliefs are fitted from, so they are not fitted again; any other timing does.
    measurements = RouteMeasurements()
    first, second = (NodeId("a"), NodeId("b")), (NodeId("c"),)
    seen = []
    for hops, ms in [(first, 40.0), (first, 40.0), (second, 50.0), (second, 90.0), (first, 40.0), (first, 40.0)]:
        version, before = measurements.version, measurements.recent(0.0)
        measurements.observe(RouteTiming(hops, ms, tokens=16), 0.0)
        seen.append(measurements.version != version)
        assert seen[-1] == (measurements.recent(0.0) != before)
    assert seen == [True, False, True, True, True, False]
