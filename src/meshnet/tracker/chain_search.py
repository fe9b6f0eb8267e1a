"""The route search: the cheapest chain of nodes from layer boundary 0 to the last one.

The plan is a shortest path over the layer boundaries ``0 .. n_layers``. Each eligible node is
one edge from its start boundary to its stop boundary, because a shard runs its whole slice
(a derivative GGUF of exactly its layers) and cannot be entered or left mid-range. This is
Petals' ``RemoteSequenceManager._build_inference_graph`` (client/routing/sequence_manager.py)
with its "force to go to the end of each server" rule made structural: Petals adds per-block
edges but only lets a path switch servers at a span's end, to keep the graph linear in servers;
for us a span *is* the unit, so the graph is linear for free.

The caller (``tracker.routing``) picks which nodes may take part (one recipe, nothing
excluded) and turns the chain into a plan; the edge costs (milliseconds per decoded token) are
the cost model's (``tracker.route_costs``); this module only finds the cheapest chain, ties
broken so the same inputs always give the same one.
Everything here is a function of its arguments: no clock, no registry, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from meshnet.core.ids import NodeId
from meshnet.tracker.route_costs import (
    NO_SEAMS,
    LatencyTable,
    NodeView,
    RoutingCosts,
    SeamLatencies,
    node_cost_ms,
    seam_cost_ms,
    unmeasured_seam_ms,
)

Spans = Mapping[int, Mapping[int, Sequence[tuple[float, NodeView]]]]
"""One recipe's nodes by start boundary, then stop boundary, each with its own cost
(``NodeView.cost_ms``), cheapest first; no empty list. Nodes spanning the same layers differ only
by that cost and their seams: sorted so, the planner's bound prunes a span's whole costlier
tail at once and reads one node per span for its lower bound (issue 36: the bound's pass over
every node was half of a 3,000-node replan)."""


def spans_of(nodes: Iterable[NodeView], costs: RoutingCosts) -> Spans:
    """``nodes`` (of one recipe) as ``Spans``, priced with ``costs``."""
    spans: dict[int, dict[int, list[tuple[float, NodeView]]]] = {}
    for node in nodes:
        layers = node.layers
        spans.setdefault(layers.start, {}).setdefault(layers.stop, []).append((node.cost_ms(costs), node))
    for by_stop in spans.values():
        for priced in by_stop.values():
            priced.sort(key=own_cost)
    return spans


def own_cost(priced: tuple[float, NodeView]) -> float:
    """The sort key of a ``Spans`` entry."""
    return priced[0]


def shortest_chain(
    usable: Sequence[NodeView],
    n_layers: int,
    latency_ms: LatencyTable,
    costs: RoutingCosts,
) -> tuple[tuple[NodeView, ...], float] | None:
    """The cheapest chain from boundary 0 to ``n_layers``, and its cost; None: none.

    A chain's label is (cost, relayed hop count, hop count, node ids): the cheapest label wins,
    so ties break on fewer relayed hops, then on fewer hops, then on node ids, and the same
    inputs always give the same route, which keeps sessions sticky. The state is "the last
    node taken", because the seam cost depends on which node hands over to which.

    Every edge goes forward (a node's range is non-empty), so the boundaries are a topological
    order: one pass over them settles every state, no priority queue needed. The pairs are
    what made the first planner (a Dijkstra pushing every pair of meeting nodes) grow faster
    than N^2: here a node's best predecessor over an unmeasured seam (the default cost, the
    same from any predecessor) is the cheapest state ending at its start that has no measured
    seam into it, and only its measured predecessors are costed pair by pair (``_best_label``).
    Work per call: O(N log N + measured seams into the model's nodes), bounded by the 12-entry
    peer lists, where the first planner's grew with the pairs of meeting nodes.
    """
    return chain_over_spans(spans_of(usable, costs), n_layers, latency_ms, costs)


def chain_over_spans(
    spans: Spans, n_layers: int, latency_ms: LatencyTable, costs: RoutingCosts
) -> tuple[tuple[NodeView, ...], float] | None:
    """``shortest_chain`` over nodes already indexed (``spans_of``, or a ``PlannedViews``' own)."""
    if n_layers == 0:
        return (), 0.0
    incoming = _incoming(latency_ms)
    bounds = _ChainBounds(spans, n_layers, latency_ms, costs)
    ending: dict[int, list[_Label]] = {0: [(0.0, 0, 0, (), ())]}
    for boundary in sorted(spans):
        arrived = ending.pop(boundary, None)
        if boundary >= n_layers or not arrived:
            continue
        arrived.sort()
        by_last = {label[4][-1].node_id: label for label in arrived if label[4]}
        for stop, priced in spans[boundary].items():
            limit = bounds.limit_ms(arrived[0][0], boundary, stop)
            for own_ms, node in priced:
                if own_ms > limit:
                    break  # every chain through it, or through a costlier node of its span, costs more
                label = _best_label(node, arrived, by_last, incoming(node.node_id), costs)
                ending.setdefault(stop, []).append(label)
    finals = ending.get(n_layers)
    if not finals:
        return None
    cost, _, _, _, chain = min(finals)
    return chain, cost


class _ChainBounds:
    """Lower bounds on what the rest of a chain costs, and the cost of one real chain: a node
    whose every chain must cost more than that one is not worth a label.

    ``rest[b]`` is at most what any chain from boundary ``b`` to the end costs: per hop the
    node's own cost and the least any seam can cost (the per-seam overhead; none before a first
    hop), minimised backwards over the boundaries. Following its choices from 0 gives a real
    chain, priced with its real seams: an upper bound on the cheapest. A node is skipped only
    when its bound exceeds that by more than float rounding, so the chain the planner returns,
    ties and all, is the one it returns without the bound: every chain through a skipped node
    (and any label built on it) costs more than the best. Nodes far slower than the best route,
    the bulk of a large swarm, are then never labelled. (Each node's cheapest measured seam
    would tighten the bound, but finding it costs more than the labels it saves.) Only the
    cheapest node of each span can be a choice, so the bound reads one node per span."""

    _ROUNDING = 1e-9

    def __init__(self, spans: Spans, n_layers: int, latency_ms: LatencyTable, costs: RoutingCosts) -> None:
        self._seam_ms = min(costs.seam_overhead_ms, unmeasured_seam_ms(costs, relayed=False))
        self.rest: dict[int, float] = {n_layers: 0.0}
        choice: dict[int, NodeView] = {}
        for boundary in sorted(spans, reverse=True):
            best, seam = math.inf, 0.0 if boundary == 0 else self._seam_ms
            for stop, priced in spans[boundary].items():
                own_ms, node = priced[0]
                total = own_ms + seam + self.rest.get(stop, math.inf)
                if total < best:
                    best, choice[boundary] = total, node
            if best < math.inf:
                self.rest[boundary] = best
        self.known = _chain_cost(choice, n_layers, latency_ms, costs)
        self._limit = self.known + self._ROUNDING * (1.0 + abs(self.known))

    def limit_ms(self, arrived_ms: float, start: int, stop: int) -> float:
        """The most a node from ``start`` to ``stop`` may cost on its own for a chain through it,
        reaching ``start`` at ``arrived_ms`` at best, not to cost more than the known chain."""
        seam = 0.0 if start == 0 else self._seam_ms
        return self._limit - (arrived_ms + seam + self.rest.get(stop, math.inf))


def _chain_cost(choice: Mapping[int, NodeView], n_layers: int, latency_ms: LatencyTable, costs: RoutingCosts) -> float:
    """The real cost of the chain ``choice`` makes from boundary 0 (inf: it makes none)."""
    total, boundary, before = 0.0, 0, None
    while boundary < n_layers:
        node = choice.get(boundary)
        if node is None:
            return math.inf
        if before is not None:
            total += seam_cost_ms(before.node_id, node.node_id, latency_ms, costs, relayed=node.relayed)
        total += node_cost_ms(node, costs)
        boundary, before = node.layers.stop, node
    return total


_Label = tuple[float, int, int, tuple[str, ...], tuple[NodeView, ...]]
"""A chain's (cost, relayed hop count, hop count, node ids, nodes): compared in that order."""


def _best_label(
    node: NodeView,
    arrived: Sequence[_Label],
    by_last: Mapping[NodeId, _Label],
    measured_into: Mapping[NodeId, float],
    costs: RoutingCosts,
) -> _Label:
    """The cheapest label of a chain ending with ``node``, over the chains ``arrived`` at its
    start (sorted, cheapest first; ``by_last`` indexes them by their last node).

    Over an unmeasured seam the step is the same from every arrival, so only the cheapest
    arrivals without a measured seam into ``node`` compete (all that tie on cost); over a
    measured seam each predecessor is costed, the few whose cost cannot beat the best so far
    without building a label. Costs are summed in the first planner's order, so floats agree,
    and appending the same node keeps two labels' order, so only the winner's label is built."""
    own = node.cost_ms(costs)
    relayed = int(node.relayed)
    if not arrived[0][4]:
        return _extend(arrived[0], node, own, relayed)  # the first hop: no seam, no other way in
    unmeasured = own + unmeasured_seam_ms(costs, relayed=bool(relayed))
    best: tuple[float, int, int, tuple[str, ...]] | None = None
    best_before, best_step = arrived[0], unmeasured
    for label in arrived:
        if label[4][-1].node_id in measured_into:
            continue
        key = (label[0] + unmeasured, label[1] + relayed, label[2], label[3])
        # Sorted by cost: once the sum grows past the first's, no later arrival can tie it.
        if best is not None and key[0] > best[0]:
            break
        if best is None or key < best:
            best, best_before = key, label
    for before, measured in measured_into.items():
        found = by_last.get(before)
        if found is None:
            continue
        step = own + (measured + costs.seam_overhead_ms)
        cost = found[0] + step
        if best is not None and cost > best[0]:
            continue
        key = (cost, found[1] + relayed, found[2], found[3])
        if best is None or key < best:
            best, best_before, best_step = key, found, step
    return _extend(best_before, node, best_step, relayed)


def _extend(label: _Label, node: NodeView, step_ms: float, relayed: int) -> _Label:
    cost, relayed_count, hop_count, ids, chain = label
    return (cost + step_ms, relayed_count + relayed, hop_count + 1, (*ids, node.node_id), (*chain, node))


def _incoming(latency_ms: LatencyTable) -> Callable[[NodeId], Mapping[NodeId, float]]:
    """Measured seams into a node, by the node before it: the table's own index when it keeps
    one (``SeamLatencies``), else one pass over a plain table."""
    if isinstance(latency_ms, SeamLatencies):
        return latency_ms.into
    into: dict[NodeId, dict[NodeId, float]] = {}
    for (before, after), measured in latency_ms.items():
        into.setdefault(after, {})[before] = measured
    return lambda node_id: into.get(node_id, NO_SEAMS)
