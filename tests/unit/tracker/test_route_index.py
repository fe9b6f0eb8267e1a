"""The route index stays what a from-scratch rebuild gives, and cached plans stay the planner's.

A real ``NodeRegistry`` (fake clock) takes seeded random sequences of registrations (some at
an address or id already taken, some private), heartbeats (loads, queues, peer round trips),
routes (which count sessions against free room), measured route timings and departures.
After every step the index must equal a rebuild from the registry's entries, computed the way
the tracker did before the index (``_latency_from_scratch`` is that code; believed rates by
the whole fit as it was before beliefs were kept incrementally, ``claims_reference``), and the route the
registry hands out (through its plan cache) must be the first planner's (``reference_routing``)
on the rebuilt views. Round trips are drawn from values further apart than the cache's
tolerance, so every change the cache must see is one it must act on.
"""

from __future__ import annotations

import random
from dataclasses import replace

import claims_reference
import pytest
import reference_routing
from manual_clock import ManualClock
from tracker_samples import MODEL, OTHER_RECIPE, RECIPE, registration

from meshnet.core.errors import NoRoute
from meshnet.core.ids import NodeId, SessionId
from meshnet.core.tracking import NodeLoad, RouteQuery, RouteTiming
from meshnet.tracker.node_entry import NodeEntry
from meshnet.tracker.registry import NodeRegistry
from meshnet.tracker.route_costs import LatencyTable, NodeView

ADDRESSES = [f"10.0.0.{index}:9000" for index in range(24)]
RECIPES = [RECIPE, OTHER_RECIPE, replace(RECIPE, model_sha256="11" * 32)]
STEPS = 400


def _latency_from_scratch(entries: tuple[NodeEntry, ...]) -> LatencyTable:
    """The registry's latency table as it was computed for every route before the index."""
    by_address = {entry.record.address: entry.node_id for entry in entries if entry.routable}
    table: dict[tuple[NodeId, NodeId], float] = {}
    for entry in entries:
        for address, rtt_ms in entry.load.peer_rtt_ms if entry.load else ():
            peer = by_address.get(address)
            if peer is not None:
                table[(entry.node_id, peer)] = rtt_ms / 2.0
    return table


def _views_from_scratch(registry: NodeRegistry, latency: LatencyTable) -> tuple[NodeView, ...]:
    views = tuple(entry.view() for entry in registry.entries() if entry.routable)
    routes = registry._measured.recent(registry.now())
    rates = {
        view.node_id: view.decode_tokens_per_s
        for view in claims_reference.believed_views(views, routes, latency_ms=latency)
    }
    return tuple(replace(view, decode_tokens_per_s=rates[view.node_id]) for view in views)


def _step(rng: random.Random, registry: NodeRegistry, served: list[RouteTiming], *, fixed_peers: bool = False) -> None:
    """One random change. ``fixed_peers``: each node always reports the same round trips, so
    heartbeats move only loads (queues, room) and nothing hides a load change behind a seam's."""
    entries = registry.entries()
    action = rng.random()
    if action < 0.25 or not entries:
        recipe = rng.choice(RECIPES)
        start = rng.choice([0, 0, 5, 10, 10, 15])
        stop = min(start + rng.choice([5, 10, 20]), RECIPE.n_layers)
        record = registration(
            start, stop, address=rng.choice(ADDRESSES), recipe=recipe, decode_tokens_per_s=rng.choice([0.0, 50, 100])
        )
        node_id = NodeId(f"n{rng.randrange(40)}")
        registry.register(
            replace(record, model=f"m-{recipe.model_sha256[:2]}"), node_id, rng.choice(["public"] * 5 + ["private"])
        )
    elif action < 0.75:
        node_id = rng.choice(entries).node_id
        peer_rng = random.Random(str(node_id)) if fixed_peers else rng
        named = peer_rng.sample(ADDRESSES, peer_rng.randint(0, 6))
        peers = tuple((address, peer_rng.choice([2.0, 6.0, 20.0])) for address in named)
        load = NodeLoad(free_sessions=rng.choice([0, 1, 3]), queue_depth=rng.choice([0, 0, 2]), peer_rtt_ms=peers)
        registry.heartbeat(node_id, load)
    elif action < 0.85:
        registry.deregister(rng.choice(entries).node_id)
    elif action < 0.92 and served:
        timing = rng.choice(served)
        registry.observe_route(replace(timing, decode_ms_per_token=rng.choice([30.0, 80.0, 200.0])))
    else:
        model = rng.choice([f"m-{recipe.model_sha256[:2]}" for recipe in RECIPES])
        try:
            route = registry.choose_route(RouteQuery(model=model, session_id=SessionId(f"s{rng.randrange(10**6)}")))
        except NoRoute:
            return
        served.append(RouteTiming(route.node_ids, 50.0, tokens=8))


def _check_against_rebuild(registry: NodeRegistry) -> int:
    """The index equals a rebuild, and every model's route the first planner's; routes planned."""
    latency = _latency_from_scratch(registry.entries())
    assert registry.latency_table() == latency
    views = _views_from_scratch(registry, latency)
    assert registry.node_views() == views
    planned = 0
    for model in {"m-00", "m-11", MODEL, RECIPE.fingerprint()}:
        try:
            expected = reference_routing.choose_model_route(views, model, latency_ms=latency)
        except NoRoute as refused:
            with pytest.raises(NoRoute) as also:
                registry.choose_route(RouteQuery(model=model))
            assert also.value.message == refused.message
            continue
        route = registry.choose_route(RouteQuery(model=model))
        assert (route.hops, route.ms_per_token) == (expected.hops, expected.ms_per_token)
        planned += 1
    return planned


@pytest.mark.parametrize("seed", range(8))
def test_the_index_equals_a_rebuild_and_routes_equal_the_first_planners(seed: int) -> None:
    rng = random.Random(seed)
    registry = NodeRegistry(clock=ManualClock(1000.0), heartbeat_interval_s=2.0)
    served: list[RouteTiming] = []
    planned = 0
    for _ in range(STEPS):
        _step(rng, registry, served)
        planned += _check_against_rebuild(registry)
    assert planned > STEPS // 4


@pytest.mark.parametrize("seed", range(8))
def test_routes_equal_the_first_planners_when_heartbeats_move_only_loads(seed: int) -> None:
    """Plans kept across changes off them must still be the planner's: a node off the plans
    that fills up or queues more keeps them, one that gets room back or a shorter queue does not."""
    rng = random.Random(seed)
    registry = NodeRegistry(clock=ManualClock(1000.0), heartbeat_interval_s=2.0)
    served: list[RouteTiming] = []
    planned = 0
    for _ in range(STEPS):
        _step(rng, registry, served, fixed_peers=True)
        planned += _check_against_rebuild(registry)
    assert planned > STEPS // 4
    assert registry._index.cache.hits > 0  # some plans outlived changes off them


@pytest.mark.parametrize("seed", range(4))
def test_with_a_staleness_window_routes_are_the_first_planners_once_it_passed(seed: int) -> None:
    """With improvements allowed to wait (``plan_staleness_s``), a route asked once the window
    has passed since the last change is the first planner's: what waited was only ever an
    improvement, never a plan node that filled up, slowed or left."""
    rng = random.Random(seed)
    clock = ManualClock(1000.0)
    # Intervals long enough that no node expires while the clock walks on (expiry is not tested here).
    registry = NodeRegistry(clock=clock, heartbeat_interval_s=1000.0, plan_staleness_s=0.5)
    served: list[RouteTiming] = []
    for _ in range(STEPS):
        _step(rng, registry, served, fixed_peers=seed % 2 == 0)
        clock.now += 0.5
        _check_against_rebuild(registry)


def test_a_cached_plan_outlives_small_round_trip_moves_but_not_moves_that_add_up() -> None:
    """The plan cache's documented staleness: a round trip within the tolerance (1 ms one way)
    of what the plan was made with keeps the plan even where a fresh plan would differ; small
    moves that add up past it, each within the tolerance of the report before, do not."""
    registry = NodeRegistry(clock=ManualClock(1000.0), heartbeat_interval_s=2.0)
    head = registry.register(registration(0, 10, address="h:1"), NodeId("head"))
    for name in ("a", "b"):
        registry.register(registration(10, 20, address=f"{name}:1"), NodeId(name))

    def route_after(rtt_to_a_ms: float) -> list[str]:
        registry.heartbeat(head, NodeLoad(free_sessions=4, peer_rtt_ms=(("a:1", rtt_to_a_ms), ("b:1", 6.0))))
        return [str(node_id) for node_id in registry.choose_route(RouteQuery(model=MODEL)).node_ids]

    cache = registry._index.cache
    assert route_after(4.8) == ["head", "a"]  # 2.4 ms one way into a, 3 ms into b
    misses = cache.misses
    assert route_after(5.7) == ["head", "a"]  # 2.85 ms: still the best
    assert route_after(6.6) == ["head", "a"]  # 3.3 ms: b is better now, but 0.9 ms from the plan's 2.4
    assert cache.misses == misses
    assert route_after(7.2) == ["head", "b"]  # 3.6 ms: 0.3 ms from the last report, 1.2 ms from the plan's
    assert cache.misses == misses + 1


def test_an_improvement_waits_for_the_staleness_window_a_full_plan_node_does_not() -> None:
    """A plan node that fills up is replaced on the next route; the node getting room back off
    the plan is taken again only once ``plan_staleness_s`` has passed; so is a better newcomer."""
    clock = ManualClock(1000.0)
    registry = NodeRegistry(clock=clock, heartbeat_interval_s=2.0, plan_staleness_s=0.5)
    head = registry.register(registration(0, 10, address="h:1"), NodeId("head"))
    fast = registry.register(registration(10, 20, address="a:1", decode_tokens_per_s=200.0), NodeId("a"))
    registry.register(registration(10, 20, address="b:1", decode_tokens_per_s=100.0), NodeId("b"))

    def route() -> list[str]:
        return [str(node_id) for node_id in registry.choose_route(RouteQuery(model=MODEL)).node_ids]

    registry.heartbeat(head, NodeLoad(free_sessions=4))
    assert route() == ["head", "a"]
    registry.heartbeat(fast, NodeLoad(free_sessions=0))
    assert route() == ["head", "b"]  # at once: the plan's own node is full
    registry.heartbeat(fast, NodeLoad(free_sessions=4))
    clock.now += 0.4
    assert route() == ["head", "b"]  # room again off the plan: may wait the window
    clock.now += 0.1
    assert route() == ["head", "a"]
    registry.register(registration(10, 20, address="c:1", decode_tokens_per_s=400.0), NodeId("c"))
    assert route() == ["head", "a"]
    clock.now += 0.5
    assert route() == ["head", "c"]


def test_a_node_off_the_plan_believed_faster_is_planned_with() -> None:
    """A route timing that makes a node off the cached plan believed faster than the plan's
    must reach the next route (a change of belief is an improvement like room regained)."""
    registry = NodeRegistry(clock=ManualClock(1000.0), heartbeat_interval_s=2.0)
    fast = registry.register(registration(0, 20, address="a:1"), NodeId("a"))
    slow = registry.register(registration(0, 20, address="b:1"), NodeId("b"))
    registry.observe_route(RouteTiming((fast,), decode_ms_per_token=30.0, tokens=64))
    registry.observe_route(RouteTiming((slow,), decode_ms_per_token=60.0, tokens=64))
    assert [str(n) for n in registry.choose_route(RouteQuery(model=MODEL)).node_ids] == ["a"]
    for _ in range(9):
        registry.observe_route(RouteTiming((slow,), decode_ms_per_token=10.0, tokens=64))
    assert _check_against_rebuild(registry) > 0
    assert [str(n) for n in registry.choose_route(RouteQuery(model=MODEL)).node_ids] == ["b"]
