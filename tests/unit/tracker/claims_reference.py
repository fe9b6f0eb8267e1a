"""REFERENCE ONLY (tests): tracker/claims.py as it was before the incremental beliefs (issue 36).

Kept verbatim so that the property tests compare today's beliefs with this fit, bit for bit.
The module doc below is the original's.

How far the tracker believes a node's self-declared speed: measurement first, claims capped.

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
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from meshnet.core.ids import NodeId
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
    capped = {view.node_id: view for view in credible_views(views, max_ratio)}
    in_hops = [
        RouteMeasure(route.hops, max(route.ms_per_token - _seams_ms(route.hops, latency_ms, costs), 0.0))
        for route in routes
        if all(hop in capped for hop in route.hops)
    ]
    measured = measured_nodes(in_hops, capped)
    if not measured:
        return tuple(capped.values())
    fitted = fit_hop_ms(_even_split(in_hops, capped), in_hops)
    served = {node_id: replace(capped[node_id], decode_tokens_per_s=1000.0 / fitted[node_id]) for node_id in measured}
    claimed = _lower_medians(views)
    known = tuple(served.values())
    return tuple(served.get(view.node_id) or _newcomer(view, claimed, known) for view in capped.values())


def _newcomer(view: NodeView, claimed: dict[str, float], served: Sequence[NodeView]) -> NodeView:
    """An unmeasured node beside measured ones: its claim capped at its recipe's lower median
    claim, but just ahead of the best measured node of its very layers, so that it is tried."""
    recipe = [other for other in served if other.fingerprint == view.fingerprint]
    if not recipe:
        return view  # nothing of its recipe measured yet: claims are all there is (the 32x cap)
    view = _capped(view, claimed, 1.0)
    peers = [other.decode_tokens_per_s for other in recipe if other.layers == view.layers]
    if peers:
        return replace(view, decode_tokens_per_s=max(view.decode_tokens_per_s, max(peers) / NEWCOMER_EDGE))
    return view


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
    median = reference.get(view.fingerprint)
    if median is not None and view.decode_tokens_per_s * len(view.layers) > max_ratio * median:
        return replace(view, decode_tokens_per_s=median / len(view.layers))
    return view


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
