"""How far the tracker believes a node's self-declared speed: measurement first, claims capped.

A worker reports the decode rate it measured itself, and the round trips to its peers; nothing
stops a rogue (or a misconfigured) node from claiming 1e9 tok/s and 0.01 ms and winning every
route. So the tracker believes, in this order:

1. What routes measured (``tracker.speeds``): a node on a route a gateway timed is believed at
   the time per token the fit of the measured routes gives it, whatever it claims. The routes'
   times are taken less the seams the planner charges them (with the round trips the nodes
   reported), so the fit gives every measured route exactly its measured cost: a lie about a
   round trip only moves time from the seam into the liar's own hop, and a measured route costs
   what it measured whatever its nodes report.
2. Before a node is measured, its claim, capped per layer at the lower median of its recipe's
   claims once any node of the recipe was measured, but believed just ahead of the best
   measured node of its very layers (``NEWCOMER_EDGE``) when the cap leaves it behind: a
   newcomer is tried once, and that request measures it. So a new boaster gets one route, not
   all of them, and an honest newcomer is never stuck behind a measured boaster whose
   slowness the fit shared with its route's other hops (nor behind its own pessimistic
   start-up benchmark). While nothing of the recipe is measured (a swarm's first request),
   claims up to ``MAX_CLAIM_RATIO`` times that median are believed, so honestly faster nodes
   are preferred from the start; an outlier claim counts as the median. Lower medians, so one
   liar among two nodes cannot drag the reference up; a node alone with its recipe has
   nothing to be checked against.

The tracker keeps these beliefs current at every measured route (one per served request), so
they are computed in two parts: ``Claims``, what membership alone decides (once per
membership), and ``believe``, the fit plus only the nodes a change of it can move (a newcomer
reads the best measured node of its recipe and layers, kept per group, not a scan of the
measured nodes). ``believed_views`` is both at once; all give the same rates, bit for bit, as
the whole fit per call did (tests/unit/tracker/claims_reference.py).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from meshnet.core.ids import NodeId
from meshnet.core.layers import LayerRange
from meshnet.tracker.route_costs import DEFAULT_COSTS, NO_LATENCIES, LatencyTable, NodeView, RoutingCosts, seam_cost_ms
from meshnet.tracker.speeds import RouteMeasure, fit_hop_ms, measured_nodes

NEWCOMER_EDGE = 0.9
"""An unmeasured node is believed this fraction of the time of the best measured node of its
layers (if its capped claim is not better): tried once, which measures it."""
MAX_CLAIM_RATIO = 32.0
"""Generous: a GPU node beside CPU nodes may honestly be 10-30x faster per layer. What it stops
is the unbounded claim (1e9 tok/s) that would win every route whatever the others offer."""


def believed_views(
    views: Sequence[NodeView],
    routes: Sequence[RouteMeasure] = (),
    *,
    latency_ms: LatencyTable = NO_LATENCIES,
    costs: RoutingCosts = DEFAULT_COSTS,
    max_ratio: float = MAX_CLAIM_RATIO,
) -> tuple[NodeView, ...]:
    """``views`` with each node's decode rate as the tracker believes it (see the module doc)."""
    claims = Claims.of(views, max_ratio)
    rates = believe(claims, routes, latency_ms=latency_ms, costs=costs).rates
    return tuple(
        view if rates[node_id] == view.decode_tokens_per_s else replace(view, decode_tokens_per_s=rates[node_id])
        for node_id, view in claims.views.items()
    )


_Group = tuple[str, LayerRange]
"""A recipe's fingerprint and a layer range: the nodes a newcomer is compared with."""


@dataclass(frozen=True)
class Claims:
    """What membership alone decides about every node's belief, computed once per membership.

    Per node: its view (the last of an id wins), its claim capped at ``max_ratio`` times its
    recipe's lower median (believed while nothing of its recipe is measured) and capped again
    at the median (the newcomer's start once something is). And who shares a recipe, and a
    recipe and layer range: the nodes a change of measurement there can move."""

    views: Mapping[NodeId, NodeView]
    capped: Mapping[NodeId, float]
    newcomer: Mapping[NodeId, float]
    recipes: Mapping[str, tuple[NodeId, ...]]
    groups: Mapping[_Group, tuple[NodeId, ...]]

    @classmethod
    def of(cls, views: Iterable[NodeView], max_ratio: float = MAX_CLAIM_RATIO) -> Claims:
        views = tuple(views)
        reference = _lower_medians(views)
        by_id = {view.node_id: view for view in views}
        capped: dict[NodeId, float] = {}
        newcomer: dict[NodeId, float] = {}
        recipes: dict[str, list[NodeId]] = {}
        groups: dict[_Group, list[NodeId]] = {}
        for node_id, view in by_id.items():
            median, n_layers = reference.get(view.fingerprint), len(view.layers)
            capped[node_id] = _capped_rate(view.decode_tokens_per_s, n_layers, median, max_ratio)
            newcomer[node_id] = _capped_rate(capped[node_id], n_layers, median, 1.0)
            recipes.setdefault(view.fingerprint, []).append(node_id)
            groups.setdefault((view.fingerprint, view.layers), []).append(node_id)
        return cls(
            by_id,
            capped,
            newcomer,
            {fingerprint: tuple(ids) for fingerprint, ids in recipes.items()},
            {group: tuple(ids) for group, ids in groups.items()},
        )


@dataclass(frozen=True)
class Beliefs:
    """Every node's believed decode rate, with what a later ``believe`` needs to redo only the
    nodes a new measurement can move: the measured nodes' rates and, per recipe and layer
    range, the best of them (a newcomer is believed just ahead of it)."""

    claims: Claims
    rates: Mapping[NodeId, float]
    served: Mapping[NodeId, float]
    best: Mapping[_Group, float]
    changed: frozenset[NodeId]
    """The nodes whose rate differs from the ``before`` it was believed from (all when none)."""


def believe(
    claims: Claims,
    routes: Sequence[RouteMeasure] = (),
    *,
    latency_ms: LatencyTable = NO_LATENCIES,
    costs: RoutingCosts = DEFAULT_COSTS,
    before: Beliefs | None = None,
) -> Beliefs:
    """The believed rates (see the module doc). The fit of the measured routes is redone whole
    (it is small: the measured routes' hops), but given ``before``, believed from the same
    ``claims``, only the nodes whose belief can have moved are believed again: measured nodes
    whose fit moved, and the nodes of a recipe and layer range whose best measured node moved
    (of a whole recipe when its first node was measured or its last one forgotten). The rates
    are the same as believing every node again."""
    served = _served(claims, routes, latency_ms, costs)
    best = _best(claims, served)
    recipes = _measured_recipes(claims, served)
    if before is None or before.claims is not claims:
        rates = {node_id: _rate(claims, node_id, served, best, recipes) for node_id in claims.views}
        old = before.rates if before is not None else {}
        return Beliefs(claims, rates, served, best, frozenset(n for n, rate in rates.items() if old.get(n) != rate))
    rates = dict(before.rates)
    changed: set[NodeId] = set()
    for node_id in _movable(claims, before, served, best, recipes):
        rate = _rate(claims, node_id, served, best, recipes)
        if rate != rates[node_id]:
            rates[node_id] = rate
            changed.add(node_id)
    return Beliefs(claims, rates, served, best, frozenset(changed))


def _movable(
    claims: Claims, before: Beliefs, served: Mapping[NodeId, float], best: Mapping[_Group, float], recipes: set[str]
) -> set[NodeId]:
    """The nodes whose belief a move from ``before`` to ``served`` can change: the measured
    nodes that moved, came or went; every node of a recipe and layer range whose best measured
    rate moved; every node of a recipe measured now and not before, or the other way round."""
    movable = set(served.keys() ^ before.served.keys())
    movable.update(node_id for node_id, rate in served.items() if before.served.get(node_id) != rate)
    for group in best.keys() | before.best.keys():
        if best.get(group) != before.best.get(group):
            movable.update(claims.groups[group])
    for fingerprint in recipes ^ _measured_recipes(claims, before.served):
        movable.update(claims.recipes[fingerprint])
    return movable


def _served(
    claims: Claims, routes: Sequence[RouteMeasure], latency_ms: LatencyTable, costs: RoutingCosts
) -> dict[NodeId, float]:
    """The measured nodes' rates: what the fit of the measured routes (seams taken out) gives."""
    views = claims.views
    in_hops = [
        RouteMeasure(route.hops, max(route.ms_per_token - _seams_ms(route.hops, latency_ms, costs), 0.0))
        for route in routes
        if all(hop in views for hop in route.hops)
    ]
    measured = measured_nodes(in_hops, views)
    if not measured:
        return {}
    fitted = fit_hop_ms(_even_split(in_hops, views), in_hops)
    return {node_id: 1000.0 / fitted[node_id] for node_id in measured}


def _best(claims: Claims, served: Mapping[NodeId, float]) -> dict[_Group, float]:
    """Per recipe and layer range, the best measured rate."""
    best: dict[_Group, float] = {}
    for node_id, rate in served.items():
        view = claims.views[node_id]
        group = (view.fingerprint, view.layers)
        best[group] = max(best[group], rate) if group in best else rate
    return best


def _measured_recipes(claims: Claims, served: Mapping[NodeId, float]) -> set[str]:
    return {claims.views[node_id].fingerprint for node_id in served}


def _rate(
    claims: Claims, node_id: NodeId, served: Mapping[NodeId, float], best: Mapping[_Group, float], recipes: set[str]
) -> float:
    """One node's belief: measured, else a newcomer beside measured nodes of its recipe (its
    claim capped at the recipe's lower median, but just ahead of the best measured node of its
    very layers, so that it is tried), else its claim (capped at ``max_ratio`` times it)."""
    rate = served.get(node_id)
    if rate is not None:
        return rate
    view = claims.views[node_id]
    if view.fingerprint not in recipes:
        return claims.capped[node_id]  # nothing of its recipe measured yet: claims are all there is
    peak = best.get((view.fingerprint, view.layers))
    newcomer = claims.newcomer[node_id]
    return newcomer if peak is None else max(newcomer, peak / NEWCOMER_EDGE)


def credible_views(views: Sequence[NodeView], max_ratio: float = MAX_CLAIM_RATIO) -> tuple[NodeView, ...]:
    """``views`` with every implausible decode-rate claim replaced by its recipe's lower median."""
    reference = _lower_medians(views)
    return tuple(_capped(view, reference, max_ratio) for view in views)


def _lower_medians(views: Iterable[NodeView]) -> dict[str, float]:
    """Per recipe, the lower median of the nodes' rates per layer (layers per second)."""
    per_layer: dict[str, list[float]] = {}
    for view in views:
        if view.decode_tokens_per_s > 0:
            per_layer.setdefault(view.fingerprint, []).append(view.decode_tokens_per_s * len(view.layers))
    return {fingerprint: statistics.median_low(rates) for fingerprint, rates in per_layer.items()}


def _capped(view: NodeView, reference: dict[str, float], max_ratio: float) -> NodeView:
    rate = _capped_rate(view.decode_tokens_per_s, len(view.layers), reference.get(view.fingerprint), max_ratio)
    return view if rate == view.decode_tokens_per_s else replace(view, decode_tokens_per_s=rate)


def _capped_rate(rate: float, n_layers: int, median: float | None, max_ratio: float) -> float:
    """``rate`` over ``n_layers``, or the recipe's lower median per layer where it claims more
    than ``max_ratio`` times that."""
    if median is not None and rate * n_layers > max_ratio * median:
        return median / n_layers
    return rate


def _even_split(routes: Sequence[RouteMeasure], views: Mapping[NodeId, NodeView]) -> dict[NodeId, float]:
    """Where the fit starts: each node at its layers' share of the fastest route it served on (a
    node on a fast route cannot be the slow part of a slower one). Claims play no part: a
    measured node is believed from measurement alone."""
    start: dict[NodeId, float] = {}
    for route in routes:
        per_layer = route.ms_per_token / max(sum(len(views[hop].layers) for hop in route.hops), 1)
        for hop in route.hops:
            share = per_layer * len(views[hop].layers)
            start[hop] = min(start.get(hop, share), share)
    return start


def _seams_ms(hops: Sequence[NodeId], latency_ms: LatencyTable, costs: RoutingCosts) -> float:
    return sum(seam_cost_ms(before, after, latency_ms, costs) for before, after in itertools.pairwise(hops))
