"""Pure route planning: the fastest chain of compatible shards that covers every layer.

Which nodes may be chained for a model (one recipe each: chaining shards of different recipes
corrupts the hidden state; a recipe family over several device classes only when the swarm
opts in), the plan made of the chain, and, when there is none, why, in words an operator can
act on. The search itself, a shortest path over the layer boundaries, is
``tracker.chain_search``; the edge costs (milliseconds per decoded token) are the cost model's
(``tracker.route_costs``).

Placement is out of scope: Petals' server/block_selection.py moves servers toward the blocks
with the least total throughput, but our shards load a fixed slice file, so the tracker only
routes over the ranges that exist (and ``ListModels`` says whether they chain).

Everything here is a function of its arguments: no clock, no registry, no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from meshnet.core.errors import NoRoute
from meshnet.core.events import RouteHop
from meshnet.core.ids import NodeId
from meshnet.core.layers import LayerRange
from meshnet.tracker.chain_search import Spans, chain_over_spans, shortest_chain
from meshnet.tracker.route_costs import DEFAULT_COSTS, NO_LATENCIES, LatencyTable, NodeView, RoutingCosts


@dataclass(frozen=True)
class RoutePlan:
    """The chosen chain and its estimated cost, before the registry gives it an epoch."""

    model: str
    quantization: str
    fingerprint: str
    n_layers: int
    hops: tuple[RouteHop, ...]
    ms_per_token: float


class PlannedViews(tuple[NodeView, ...]):
    """Views as a caller that keeps them indexed hands them over (``tracker.route_index``): the
    views, and every recipe's ``Spans`` over them by (fingerprint, n_layers), priced with
    ``costs``. The planner uses the spans where it would build the same from the views."""

    spans: Mapping[tuple[str, int], Spans]
    costs: RoutingCosts

    def __new__(
        cls, views: Iterable[NodeView], spans: Mapping[tuple[str, int], Spans], costs: RoutingCosts
    ) -> PlannedViews:
        made = super().__new__(cls, views)
        made.spans = spans
        made.costs = costs
        return made


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
    indexed = isinstance(nodes, PlannedViews) and nodes.costs is costs and not exclude
    usable = [] if indexed else _usable(nodes, n_layers, fingerprint, exclude)
    if isinstance(nodes, PlannedViews) and indexed:
        found = chain_over_spans(nodes.spans.get((fingerprint, n_layers), {}), n_layers, latency_ms, costs)
    else:
        found = shortest_chain(usable, n_layers, latency_ms, costs)
    if found is None:
        usable = _usable(nodes, n_layers, fingerprint, exclude)
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


def _usable(nodes: Sequence[NodeView], n_layers: int, fingerprint: str, exclude: Collection[NodeId]) -> list[NodeView]:
    return [
        node
        for node in nodes
        if node.fingerprint == fingerprint and node.n_layers == n_layers and node.node_id not in exclude
    ]


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


def mixed_device_problem(
    nodes: Sequence[NodeView], fingerprints: Collection[str], exclude: Collection[NodeId] = frozenset()
) -> str | None:
    """A recipe's device class (``Recipe.device_class``) selects llama.cpp's kernels, so shards of
    two classes chained match neither device's whole model: refused by default. When no single
    recipe covers a model but its family (the recipe on any device) does, this says what keeps
    the layers apart instead of a bare "layers missing".

    Why a model served under ``fingerprints`` (none of which routes alone) has no route,
    when shards of one recipe family on two or more device classes would cover it together;
    None when they would not either (then the layers really are missing)."""
    candidates = [node for node in nodes if node.fingerprint in fingerprints and node.node_id not in exclude]
    families: dict[str, list[NodeView]] = {}
    for node in candidates:
        families.setdefault(node.record.recipe.family.fingerprint(), []).append(node)
    for members in families.values():
        if len({node.record.recipe.device_class for node in members}) < 2:
            continue
        found = shortest_chain(members, members[0].n_layers, NO_LATENCIES, DEFAULT_COSTS)
        if found is None:
            continue
        chain, _ = found
        parts: dict[str, list[str]] = {}
        for node in chain:
            parts.setdefault(node.record.recipe.device_label, []).append(str(node.layers))
        if len(parts) < 2:
            continue
        classes = "; ".join(
            f"{label} (recipe {next(n.fingerprint for n in chain if n.record.recipe.device_label == label)}, "
            f"layers {', '.join(ranges)})"
            for label, ranges in parts.items()
        )
        return (
            f"a route would need two device classes, whose kernels compute different numbers: {classes}; "
            "mixed-device routes are off in this swarm (serve every range on one device class)"
        )
    return None


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


def uncovered_layers(nodes: Iterable[NodeView], n_layers: int) -> tuple[LayerRange, ...]:
    """Maximal runs of layers in ``[0, n_layers)`` that no node in ``nodes`` holds."""
    covered = [False] * n_layers
    for node in nodes:
        for layer in range(node.layers.start, min(node.layers.stop, n_layers)):
            covered[layer] = True
    gaps: list[LayerRange] = []
    gap_start: int | None = None
    for layer in range(n_layers + 1):
        is_gap = layer < n_layers and not covered[layer]
        if is_gap and gap_start is None:
            gap_start = layer
        elif not is_gap and gap_start is not None:
            gaps.append(LayerRange(gap_start, layer))
            gap_start = None
    return tuple(gaps)


def _explain_no_route(
    nodes: Sequence[NodeView],
    usable: Sequence[NodeView],
    n_layers: int,
    fingerprint: str,
    exclude: Collection[NodeId],
) -> str:
    """What is missing, in words an operator can act on: which layers, why nodes were skipped."""
    gaps = uncovered_layers(usable, n_layers)
    if gaps:
        problem = f"layers {', '.join(str(gap) for gap in gaps)} have no live shard"
    else:
        # Every layer is held, but the ranges overlap without meeting at a common boundary.
        frontier = max(_reachable_boundaries(usable))
        problem = f"the shards' ranges do not meet: no shard starts at layer {frontier}"
    excluded = sum(1 for node in nodes if node.fingerprint == fingerprint and node.node_id in exclude)
    suffix = f" (skipped shards: {excluded} excluded)" if excluded else ""
    return f"no route for recipe {fingerprint} over layers {LayerRange(0, n_layers)}: {problem}{suffix}"


def _reachable_boundaries(usable: Sequence[NodeView]) -> set[int]:
    reachable = {0}
    frontier = [0]
    while frontier:
        boundary = frontier.pop()
        for node in usable:
            if node.layers.start == boundary and node.layers.stop not in reachable:
                reachable.add(node.layers.stop)
                frontier.append(node.layers.stop)
    return reachable
