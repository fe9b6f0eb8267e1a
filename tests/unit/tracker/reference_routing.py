"""Today's route planner before issue 36, kept verbatim as the oracle of the property test.

The planner in ``meshnet.tracker.routing`` replaced this Dijkstra over "last node taken"
states (it pushed every pair of meeting nodes, N^2 / boundaries heap entries carrying whole
chains) by a pass over the boundaries in order. ``test_route_planner_equivalence`` checks that
both choose exactly the same route, at the same cost, or fail alike. Only the search is copied:
the cost functions and explanations are the module's own, so the comparison is of the search.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Sequence

from meshnet.core.errors import NoRoute
from meshnet.core.ids import NodeId
from meshnet.tracker.routing import (
    DEFAULT_COSTS,
    NO_LATENCIES,
    LatencyTable,
    NodeView,
    RoutePlan,
    RoutingCosts,
    _explain_no_route,
    mixed_device_problem,
    node_cost_ms,
    seam_cost_ms,
)


def choose_route(
    nodes: Sequence[NodeView],
    n_layers: int,
    fingerprint: str,
    *,
    latency_ms: LatencyTable = NO_LATENCIES,
    exclude: Collection[NodeId] = frozenset(),
    costs: RoutingCosts = DEFAULT_COSTS,
) -> RoutePlan:
    """The cheapest chain of ``fingerprint`` nodes over ``[0, n_layers)``.

    Every node in ``nodes`` passed the tracker's certification check when it registered.
    Raises ``NoRoute`` naming the layers no eligible node covers, or the boundary where the
    covering nodes fail to meet.
    """
    usable = [
        node
        for node in nodes
        if node.fingerprint == fingerprint and node.n_layers == n_layers and node.node_id not in exclude
    ]
    found = shortest_chain(usable, n_layers, latency_ms, costs)
    if found is None:
        raise NoRoute(_explain_no_route(nodes, usable, n_layers, fingerprint, exclude))
    chain, total_ms = found
    first = chain[0].record
    return RoutePlan(
        model=first.model,
        quantization=first.quantization,
        fingerprint=fingerprint,
        n_layers=n_layers,
        hops=tuple(node.hop() for node in chain),
        ms_per_token=total_ms,
    )


def choose_model_route(
    nodes: Sequence[NodeView],
    model: str,
    *,
    latency_ms: LatencyTable = NO_LATENCIES,
    exclude: Collection[NodeId] = frozenset(),
    costs: RoutingCosts = DEFAULT_COSTS,
    mixed_devices: bool = False,
) -> RoutePlan:
    """The cheapest route for ``model``, given as a name or a recipe fingerprint.

    One name may be served under several recipes (say two quantizations): each is planned on
    its own, since chaining shards of different recipes corrupts the hidden state, and the
    fastest complete one wins. Only when none routes, and the swarm opted in
    (``mixed_devices``), a route over one recipe family on several device classes is planned
    (``choose_mixed_route``).
    """
    fingerprints = sorted({node.fingerprint for node in nodes if model in (node.model, node.fingerprint)})
    if not fingerprints:
        # Most often a model name that differs between gateway and workers: say what is served.
        served = sorted({node.model for node in nodes})
        known = f" (live shards serve {', '.join(map(repr, served))}; check --model-name)" if served else ""
        raise NoRoute(f"no live shard serves model {model!r}{known}")
    plans: list[RoutePlan] = []
    reasons: list[str] = []
    for fingerprint in fingerprints:
        n_layers = next(node.n_layers for node in nodes if node.fingerprint == fingerprint)
        try:
            plan = choose_route(nodes, n_layers, fingerprint, latency_ms=latency_ms, exclude=exclude, costs=costs)
            plans.append(plan)
        except NoRoute as error:
            reasons.append(error.message)
    if not plans and mixed_devices:
        mixed_plan = choose_mixed_route(nodes, fingerprints, latency_ms=latency_ms, exclude=exclude, costs=costs)
        if mixed_plan is not None:
            return mixed_plan
    if not plans:
        mixed = None if mixed_devices else mixed_device_problem(nodes, fingerprints, exclude)
        raise NoRoute("; ".join([mixed] if mixed else reasons))
    return min(plans, key=lambda plan: (plan.ms_per_token, plan.fingerprint))


def choose_mixed_route(
    nodes: Sequence[NodeView],
    fingerprints: Collection[str],
    *,
    latency_ms: LatencyTable = NO_LATENCIES,
    exclude: Collection[NodeId] = frozenset(),
    costs: RoutingCosts = DEFAULT_COSTS,
) -> RoutePlan | None:
    """The cheapest route over one recipe family on any device classes, or None.

    Only nodes whose numbers are measured against the CPU take part: CPU nodes (the reference)
    and GPU nodes carrying a ``drift``. The plan's fingerprint is the family's (``rcf-``), which
    every member accepts and no exact route uses, so its frames say what the route is."""
    families: dict[str, list[NodeView]] = {}
    for node in nodes:
        recipe = node.record.recipe
        measured = not recipe.device_class or node.record.capability.drift is not None
        if node.fingerprint in fingerprints and node.node_id not in exclude and measured:
            families.setdefault(recipe.family_fingerprint(), []).append(node)
    plans = []
    for family, members in sorted(families.items()):
        found = shortest_chain(members, members[0].n_layers, latency_ms, costs)
        if found is not None:
            chain, total_ms = found
            first = chain[0].record
            hops = tuple(node.hop() for node in chain)
            plans.append(RoutePlan(first.model, first.quantization, family, first.n_layers, hops, total_ms))
    return min(plans, key=lambda plan: (plan.ms_per_token, plan.fingerprint), default=None)


def shortest_chain(
    usable: Sequence[NodeView],
    n_layers: int,
    latency_ms: LatencyTable,
    costs: RoutingCosts,
) -> tuple[tuple[NodeView, ...], float] | None:
    """Dijkstra from boundary 0 to ``n_layers``.

    A search state is "the last node taken" (its stop boundary is implied), because the seam
    cost depends on which node hands over to which. Ties break on fewer relayed hops, then on
    fewer hops, then on node ids, so the same inputs always give the same route, which keeps
    sessions sticky.
    """
    by_start: dict[int, list[NodeView]] = {}
    for node in sorted(usable, key=lambda view: view.node_id):
        by_start.setdefault(node.layers.start, []).append(node)
    # heap entries: (cost, relayed hop count, hop count, node ids of the chain, chain)
    heap: list[tuple[float, int, int, tuple[str, ...], tuple[NodeView, ...]]] = [(0.0, 0, 0, (), ())]
    settled: set[NodeId | None] = set()
    while heap:
        cost, relayed_count, hop_count, ids, chain = heapq.heappop(heap)
        last = chain[-1] if chain else None
        boundary = last.layers.stop if last else 0
        if boundary == n_layers:
            return chain, cost
        state = last.node_id if last else None
        if state in settled:
            continue
        settled.add(state)
        for node in by_start.get(boundary, ()):
            if node.node_id in settled:
                continue
            step = node_cost_ms(node, costs)
            if last is not None:
                step += seam_cost_ms(last.node_id, node.node_id, latency_ms, costs, relayed=node.relayed)
            entry = (cost + step, relayed_count + node.relayed, hop_count + 1, (*ids, node.node_id), (*chain, node))
            heapq.heappush(heap, entry)
    return None
