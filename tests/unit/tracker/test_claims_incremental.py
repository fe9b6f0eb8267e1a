"""Believed rates kept current cheaply are the rates the whole fit gives, bit for bit.

``claims_reference`` is the fit as it was before beliefs were kept incrementally (issue 36):
on random swarms, routes and seam latencies, ``believed_views`` must give exactly its rates,
and ``believe`` given its previous beliefs must give exactly what believing afresh gives,
through timings added, medians moved, routes forgotten, seams moved and nodes joining and
leaving, and name as changed exactly the nodes whose rate moved.
"""

from __future__ import annotations

import random
from dataclasses import replace

import claims_reference
from tracker_samples import OTHER_RECIPE, RECIPE, view

from meshnet.core.ids import NodeId
from meshnet.tracker.claims import Beliefs, Claims, believe, believed_views
from meshnet.tracker.route_costs import NodeView
from meshnet.tracker.speeds import RouteMeasure

RECIPES = (replace(RECIPE, n_layers=6), replace(OTHER_RECIPE, n_layers=6))


def _node(rng: random.Random, index: int) -> NodeView:
    start = rng.randrange(6)
    stop = rng.randrange(start + 1, 7)
    draw = rng.random()
    rate = 1e9 if draw < 0.1 else 0.0 if draw < 0.15 else round(rng.uniform(5.0, 300.0), rng.choice([0, 3, 9]))
    return view(f"n{index}", start, stop, rate=rate, recipe=rng.choice(RECIPES))


def _route(rng: random.Random, ids: list[NodeId]) -> RouteMeasure:
    hops = rng.sample(ids, min(len(ids), rng.randint(1, 4)))
    if rng.random() < 0.1:
        hops.append(NodeId("gone"))  # a node that left: the route measures nothing any more
    return RouteMeasure(tuple(hops), rng.choice([0.5, 3.0, rng.uniform(1.0, 200.0)]))


def _latencies(rng: random.Random, ids: list[NodeId]) -> dict[tuple[NodeId, NodeId], float]:
    return {(rng.choice(ids), rng.choice(ids)): rng.uniform(0.0, 20.0) for _ in range(len(ids))}


def _reference(views: list[NodeView], routes: list[RouteMeasure], latency: dict) -> dict[NodeId, float]:
    believed = claims_reference.believed_views(views, routes, latency_ms=latency)
    return {v.node_id: v.decode_tokens_per_s for v in believed}


def test_believed_views_are_the_reference_fit_bit_for_bit() -> None:
    for seed in range(300):
        rng = random.Random(seed)
        views = [_node(rng, index) for index in range(rng.randint(1, 14))]
        ids = [v.node_id for v in views]
        routes = [_route(rng, ids) for _ in range(rng.randint(0, 6))]
        latency = _latencies(rng, ids)
        believed = believed_views(views, routes, latency_ms=latency)
        assert {v.node_id: v.decode_tokens_per_s for v in believed} == _reference(views, routes, latency), seed
        assert [v.node_id for v in believed] == ids
        assert all(v.record is original.record for v, original in zip(believed, views, strict=True))


def _step(rng: random.Random, views: list[NodeView], routes: list[RouteMeasure], latency: dict, serial: int) -> bool:
    """One change of what beliefs come from; True when it changed membership."""
    ids = [v.node_id for v in views]
    action = rng.random()
    if action < 0.45 or not routes:
        routes.append(_route(rng, ids))  # a new route timed
    elif action < 0.65:
        index = rng.randrange(len(routes))  # a timed route's median moved
        routes[index] = RouteMeasure(routes[index].hops, rng.uniform(1.0, 200.0))
    elif action < 0.75:
        routes.pop(rng.randrange(len(routes)))  # forgotten past the horizon
    elif action < 0.85:
        latency.update(_latencies(rng, ids))  # seams moved
    elif action < 0.93 or len(views) < 3:
        views.append(_node(rng, serial))  # a node joined
        return True
    else:
        views.pop(rng.randrange(len(views)))  # a node left
        return True
    return False


def test_incremental_beliefs_are_believing_afresh() -> None:
    for seed in range(120):
        rng = random.Random(seed)
        views = [_node(rng, index) for index in range(rng.randint(2, 12))]
        routes: list[RouteMeasure] = []
        latency = _latencies(rng, [v.node_id for v in views])
        claims = Claims.of(views)
        before: Beliefs | None = None
        for serial in range(100, 140):
            if _step(rng, views, routes, latency, serial):
                claims = Claims.of(views)
            beliefs = believe(claims, routes, latency_ms=latency, before=before)
            assert beliefs.rates == _reference(views, routes, latency), (seed, serial)
            old = before.rates if before is not None else {}
            assert beliefs.changed == {n for n, rate in beliefs.rates.items() if old.get(n) != rate}, (seed, serial)
            before = beliefs


def test_a_timing_believes_again_only_the_nodes_it_can_move() -> None:
    # Two recipes, each with a measured route; a new timing of the first recipe's route moves
    # nothing of the second recipe's nodes, so none of them is believed again.
    first, second = RECIPES
    views = [
        view("a", 0, 3, rate=100.0, recipe=first),
        view("b", 3, 6, rate=100.0, recipe=first),
        view("c", 0, 3, rate=100.0, recipe=second),
        view("d", 3, 6, rate=100.0, recipe=second),
        view("e", 0, 3, rate=90.0, recipe=second),
    ]
    claims = Claims.of(views)
    routes = [RouteMeasure((NodeId("a"), NodeId("b")), 40.0), RouteMeasure((NodeId("c"), NodeId("d")), 40.0)]
    before = believe(claims, routes)
    after = believe(claims, [RouteMeasure((NodeId("a"), NodeId("b")), 80.0), routes[1]], before=before)
    assert after.changed == {"a", "b"}
    assert after.rates["e"] == before.rates["e"]
