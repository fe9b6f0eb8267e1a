"""Pure layer placement: which contiguous layer range each node should serve, given its memory.

A node's cost for range A:B is the bytes its layers need (weights plus the KV of the sessions it
must hold) plus what only a head or a tail carries (the token table's touched rows, the output
norm and LM head). Ranges are chosen to minimise the fullest node's share of its budget, so a
tail holding a large LM head gets fewer layers (the way Petals balances blocks by throughput).

``suggest_layers`` answers one joining worker instead (``meshnet worker --layers auto``): the
range the swarm needs most that fits its budget, like Petals' server/block_selection.py, which
moves a server to the blocks with the least total throughput.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from meshnet.core.errors import InvalidArgument, NoRoute
from meshnet.core.layer_costs import LayerAdvice, LayerCosts
from meshnet.core.layers import LayerRange
from meshnet.core.swarm_plan import best_ranges
from meshnet.core.tracking import ModelSummary
from meshnet.tracker.route_costs import NodeView, RoutingCosts
from meshnet.tracker.routing import choose_route


def plan_ranges(costs: LayerCosts, budgets: Sequence[int]) -> list[LayerRange]:
    """Contiguous ranges covering every layer, node i getting the i-th, minimising the largest
    cost/budget ratio (``core.swarm_plan.best_ranges``); raises if even the best split overfills
    some node."""
    n_nodes = len(budgets)
    ranges, ratio = best_ranges(costs, budgets)
    if ratio > 1.0:
        worst = max(range(n_nodes), key=lambda i: costs.range_bytes(ranges[i]) / budgets[i])
        need = costs.range_bytes(ranges[worst]) / 2**20
        raise InvalidArgument(
            f"the model does not fit these {n_nodes} nodes: the best split still gives node {worst} "
            f"{need:.0f} MiB against its {budgets[worst] / 2**20:.0f} MiB; add a node or memory"
        )
    return ranges


@dataclass(frozen=True)
class ServedSpan:
    """A range some live node of the model already serves."""

    layers: LayerRange
    decode_tokens_per_s: float
    """Its measured rate (0: not measured); counted as each of its layers' throughput."""


def served_spans(nodes: Sequence[NodeView], model: str, n_layers: int) -> tuple[ServedSpan, ...]:
    """The ranges live nodes of ``model`` (name or fingerprint) serve."""
    return tuple(
        ServedSpan(node.layers, node.decode_tokens_per_s)
        for node in nodes
        if node.n_layers == n_layers and model in (node.model, node.fingerprint)
    )


def suggest_layers(costs: LayerCosts, budget_bytes: int, served: Sequence[ServedSpan]) -> LayerAdvice:
    """The range a joining node should serve: most uncovered layers first, then the fewest
    replicas, then the least throughput, then the shortest gap filler or the longest replica,
    then the earliest.

    A range starts at a boundary some route can reach (0 or a served range's start or stop), and
    stops at a boundary or just before an uncovered layer, so it chains with what is served and
    the next joiner continues where it stopped. Raises when not even one layer fits anywhere.
    """
    n_layers = costs.n_layers
    spans = [span for span in served if span.layers.stop <= n_layers]
    replicas, speed = [0] * n_layers, [0.0] * n_layers
    for span in spans:
        for layer in range(span.layers.start, span.layers.stop):
            replicas[layer] += 1
            speed[layer] += span.decode_tokens_per_s
    boundaries = sorted({0, n_layers, *(s.layers.start for s in spans), *(s.layers.stop for s in spans)})
    best: tuple[tuple[int, int, float, int, int], LayerRange] | None = None
    for start in boundaries[:-1]:
        limit = _largest_stop(costs, start, budget_bytes)
        stops = {b for b in boundaries if start < b <= limit}
        if limit > start and (limit == n_layers or replicas[limit] == 0):
            stops.add(limit)
        for stop in stops:
            window = range(start, stop)
            uncovered = sum(replicas[layer] == 0 for layer in window)
            key = (
                -uncovered,
                min(replicas[layer] for layer in window),
                min(speed[layer] for layer in window),
                # A gap gets no more than it needs (the rest of the budget holds sessions); a
                # replica is as long as fits (fewer seams on the routes through it).
                len(window) if uncovered else -len(window),
                start,
            )
            if best is None or key < best[0]:
                best = (key, LayerRange(start, stop))
    if best is None:
        raise InvalidArgument(
            f"not one layer of this model fits {budget_bytes / 2**20:.0f} MiB at any boundary a route "
            f"can reach (one node needs at least {costs.range_bytes(LayerRange(0, 1)) / 2**20:.0f} MiB)"
        )
    key, layers = best
    reason = "uncovered layers" if key[0] < 0 else f"{key[1]} replica(s), the fewest"
    return LayerAdvice(layers, reason)


def _largest_stop(costs: LayerCosts, start: int, budget_bytes: int) -> int:
    """The largest stop whose range from ``start`` fits the budget; ``start`` when none does."""
    stop = start
    while stop < costs.n_layers and costs.range_bytes(LayerRange(start, stop + 1)) <= budget_bytes:
        stop += 1
    return stop


def route_slots(holdings: Sequence[tuple[LayerRange, int]], n_layers: int) -> int:
    """Sessions the swarm can run at once: every session holds KV on some node for each layer,
    so the layer whose covering nodes admit the fewest sessions between them bounds them all
    (counting only the heads overstates it when a spare doubles a later range)."""
    if n_layers <= 0:
        return 0
    return min(sum(sessions for layers, sessions in holdings if layer in layers) for layer in range(n_layers))


def model_summaries(views: Sequence[NodeView], costs: RoutingCosts) -> tuple[ModelSummary, ...]:
    """What ``ListModels`` says of each recipe the live nodes serve: its nodes, whether it routes,
    how many sessions its heads can take."""
    summaries = []
    for fingerprint in sorted({view.fingerprint for view in views}):
        recipe_nodes = sorted((v for v in views if v.fingerprint == fingerprint), key=lambda v: v.node_id)
        first = recipe_nodes[0]
        try:
            choose_route(recipe_nodes, first.n_layers, fingerprint, costs=costs)
            routable = True
        except NoRoute:
            routable = False
        holdings = [(view.layers, view.record.capability.max_sessions) for view in recipe_nodes]
        summaries.append(
            ModelSummary(
                name=first.model,
                fingerprint=fingerprint,
                quantization=first.record.quantization,
                n_layers=first.n_layers,
                nodes=len(recipe_nodes),
                routable=routable,
                head_sessions=route_slots(holdings, first.n_layers),
            )
        )
    return tuple(sorted(summaries, key=lambda summary: (summary.name, summary.fingerprint)))
