"""Pure route planning: the fastest chain of compatible shards that covers every layer.

The plan is a shortest path over the layer boundaries ``0 .. n_layers``. Each eligible node is
one edge from its start boundary to its stop boundary, because a shard runs its whole slice
(a derivative GGUF of exactly its layers) and cannot be entered or left mid-range. This is
Petals' ``RemoteSequenceManager._build_inference_graph`` (client/routing/sequence_manager.py)
with its "force to go to the end of each server" rule made structural: Petals adds per-block
edges but only lets a path switch servers at a span's end, to keep the graph linear in servers;
for us a span *is* the unit, so the graph is linear for free.

The edge cost estimates milliseconds per decoded token, which is what a user waits for:

* compute: the node's measured single-sequence decode time over its own range
  (Petals uses ``1 / inference_rps`` per block, also measured by the server itself);
* seam: one-way shard-to-shard latency plus a fixed per-seam overhead, as Petals adds
  ``rtt / 2`` and an "empirically measured" serialization delay per server switch. A seam into
  a relayed node (behind NAT, ``NODE@RELAY``) is costed by the round trip measured through its
  relay like any other; unmeasured, it is taken as two legs plus the relay's crossing, and a
  direct hop wins any tie with a relayed one (fewer processes on the path that can fail);
* queueing: requests waiting on the node, each taken to cost about one more step of the node;
* no KV room: a large *penalty*, not exclusion (see ``RoutingCosts.full_node_penalty_ms``).

Placement is out of scope: Petals' server/block_selection.py moves servers toward the blocks
with the least total throughput, but our shards load a fixed slice file, so the tracker only
routes over the ranges that exist (and ``ListModels`` says whether they chain).

Everything here is a function of its arguments: no clock, no registry, no I/O.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType

from meshnet.core.addresses import is_relayed
from meshnet.core.errors import NoRoute
from meshnet.core.events import RouteHop
from meshnet.core.ids import NodeId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeRecord

LatencyTable = Mapping[tuple[NodeId, NodeId], float]
"""One-way latency in milliseconds from the first node to the second, as measured."""

NO_LATENCIES: LatencyTable = {}


class SeamLatencies(Mapping[tuple[NodeId, NodeId], float]):
    """A latency table that also answers "which measured seams lead into this node" without a
    scan, as the planner needs. Its owner (``tracker.route_index``) keeps it up to date between
    plans, never during one."""

    @abstractmethod
    def into(self, after: NodeId) -> Mapping[NodeId, float]:
        """Measured one-way latencies into ``after``, by the node before it."""

    def __getitem__(self, pair: tuple[NodeId, NodeId]) -> float:
        before, after = pair
        return self.into(after)[before]


NO_SEAMS: Mapping[NodeId, float] = MappingProxyType({})


@dataclass(frozen=True)
class NodeView:
    """What the planner knows about one live node: its record, and what the registry adds to it.

    A type of its own because two of its values are the tracker's, not the node's: the decode
    rate the tracker believes (``tracker.claims``: what routes measured, else a capped claim) and the room the
    node's last load report left, less the sessions routed to it since."""

    node_id: NodeId
    record: NodeRecord
    decode_tokens_per_s: float
    """Believed single-sequence decode rate over the node's layers; 0 when neither measured nor claimed."""
    free_sessions: int
    queue_depth: int = 0

    # The record's facts the planner reads, cached on the view: a replan reads each of them
    # several times for every node of the model (thousands), and through a property each read
    # cost a Python call (two for ``n_layers``): 40% of a 3,000-node replan, measured
    # (issue 36). The view is frozen and so is its record: a cached value is never stale.
    @cached_property
    def fingerprint(self) -> str:
        return self.record.fingerprint

    @cached_property
    def model(self) -> str:
        return self.record.model

    @cached_property
    def n_layers(self) -> int:
        return self.record.n_layers

    @cached_property
    def layers(self) -> LayerRange:
        return self.record.layers

    @cached_property
    def relayed(self) -> bool:
        """Reached through a relay (its address is ``NODE@RELAY``): every seam into it crosses one.
        Cached: the planner asks once per node and plan, and parsing the address is not free."""
        return is_relayed(self.record.address)

    def cost_ms(self, costs: RoutingCosts) -> float:
        """``node_cost_ms`` of this view, remembered for the last ``costs`` asked: a replan asks
        for every node of the model, and most views outlive many replans (a view changes only
        with its node's heartbeat or a route through it)."""
        remembered: tuple[RoutingCosts, float] | None = self.__dict__.get("_cost_ms")
        if remembered is not None and remembered[0] is costs:
            return remembered[1]
        cost = node_cost_ms(self, costs)
        self.__dict__["_cost_ms"] = (costs, cost)
        return cost

    def hop(self) -> RouteHop:
        """This node as a route hop: where it is, what it runs, what a request must respect."""
        return RouteHop(self.node_id, self.record.address, self.record.layers, self.record.capability)


@dataclass(frozen=True)
class RoutingCosts:
    """The planner's cost model, in milliseconds per decoded token."""

    default_latency_ms: float = 1.0
    """One-way shard-to-shard latency assumed when none was measured. Petals assumes 150 ms for
    the public internet; our swarms are private LANs, where 1 ms is already pessimistic."""
    seam_overhead_ms: float = 0.5
    """Encoding, checksumming and gRPC framing of one hidden state per seam; it makes a route
    with fewer seams win a tie, which also means fewer processes that can fail."""
    unmeasured_layer_ms: float = 5.0
    """Per-layer time charged to a node that reported no decode rate. Deliberately slow
    (a measured small model runs under 0.3 ms per layer on 2 cores) so measured nodes win."""
    relay_crossing_ms: float = 0.5
    """Added to an unmeasured seam into a relayed node, on top of two legs of the default
    latency (dialer to relay, relay to node): the relay's copy of each message. A measured
    round trip through the relay already holds all of it."""
    full_node_penalty_ms: float = 10_000.0
    """Charged to a node reporting no free session. A penalty rather than exclusion, like
    Petals' ``alloc_delay``: the count is up to one heartbeat stale, and when a full node is the
    only cover for some layers the honest answer is that node's fast RESOURCE_EXHAUSTED (503 +
    Retry-After), not a misleading "no route". It dominates any real path, so a node with room
    always wins when one exists."""


DEFAULT_COSTS = RoutingCosts()


@dataclass(frozen=True)
class RoutePlan:
    """The chosen chain and its estimated cost, before the registry gives it an epoch."""

    model: str
    quantization: str
    fingerprint: str
    n_layers: int
    hops: tuple[RouteHop, ...]
    ms_per_token: float


def compute_ms(node: NodeView, costs: RoutingCosts = DEFAULT_COSTS) -> float:
    """Estimated milliseconds one decoded token spends computing on ``node``, queue aside."""
    if node.decode_tokens_per_s > 0:
        # The rate was measured over the node's own range, so its reciprocal is the time for
        # exactly the layers this edge covers: no per-layer scaling is needed.
        return 1000.0 / node.decode_tokens_per_s
    return costs.unmeasured_layer_ms * len(node.layers)


def node_cost_ms(node: NodeView, costs: RoutingCosts = DEFAULT_COSTS) -> float:
    """Estimated milliseconds one decoded token spends on ``node``, including its queue."""
    # Each queued request is taken to add about one step of this node before ours runs.
    cost = compute_ms(node, costs) * (1 + node.queue_depth)
    if node.free_sessions <= 0:
        cost += costs.full_node_penalty_ms
    return cost


def seam_cost_ms(
    before: NodeId,
    after: NodeId,
    latency_ms: LatencyTable,
    costs: RoutingCosts = DEFAULT_COSTS,
    *,
    relayed: bool = False,
) -> float:
    """One seam's milliseconds per token: measured one-way latency (through the relay when
    ``after`` is relayed, as its probes went) else the default, plus the per-seam overhead."""
    measured = latency_ms.get((before, after))
    if measured is None:
        return _unmeasured_seam_ms(costs, relayed=relayed)
    return measured + costs.seam_overhead_ms


def _unmeasured_seam_ms(costs: RoutingCosts, *, relayed: bool) -> float:
    """A seam no probe measured: the default latency (two legs and a crossing into a relayed
    node), plus the per-seam overhead."""
    measured = 2 * costs.default_latency_ms + costs.relay_crossing_ms if relayed else costs.default_latency_ms
    return measured + costs.seam_overhead_ms


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
    if n_layers == 0:
        return (), 0.0
    starting: dict[int, list[NodeView]] = {}
    for node in usable:
        starting.setdefault(node.layers.start, []).append(node)
    incoming = _incoming(latency_ms)
    bounds = _ChainBounds(starting, n_layers, latency_ms, costs)
    ending: dict[int, list[_Label]] = {0: [(0.0, 0, 0, (), ())]}
    for boundary in sorted(starting):
        arrived = ending.pop(boundary, None)
        if boundary >= n_layers or not arrived:
            continue
        arrived.sort()
        by_last = {label[4][-1].node_id: label for label in arrived if label[4]}
        for node in starting[boundary]:
            if bounds.beyond(arrived[0][0], node):
                continue  # every chain through it costs more than one already known
            label = _best_label(node, arrived, by_last, incoming(node.node_id), costs)
            ending.setdefault(node.layers.stop, []).append(label)
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
    would tighten the bound, but finding it costs more than the labels it saves.)"""

    _ROUNDING = 1e-9

    def __init__(
        self,
        starting: Mapping[int, Sequence[NodeView]],
        n_layers: int,
        latency_ms: LatencyTable,
        costs: RoutingCosts,
    ) -> None:
        self._seam_ms = min(costs.seam_overhead_ms, _unmeasured_seam_ms(costs, relayed=False))
        self._costs = costs
        self.rest: dict[int, float] = {n_layers: 0.0}
        rest = self.rest.get  # one loop step per node of the model: thousands per replan
        choice: dict[int, NodeView] = {}
        for boundary in sorted(starting, reverse=True):
            best, seam = math.inf, 0.0 if boundary == 0 else self._seam_ms
            for node in starting[boundary]:
                total = node.cost_ms(costs) + seam + rest(node.layers.stop, math.inf)
                if total < best:
                    best, choice[boundary] = total, node
            if best < math.inf:
                self.rest[boundary] = best
        self.known = _chain_cost(choice, n_layers, latency_ms, costs)
        self._limit = self.known + self._ROUNDING * (1.0 + abs(self.known))

    def beyond(self, arrived_ms: float, node: NodeView) -> bool:
        """Whether every chain through ``node``, reaching its start at ``arrived_ms`` at best,
        costs more than the known chain."""
        seam = 0.0 if node.layers.start == 0 else self._seam_ms
        rest = self.rest.get(node.layers.stop, math.inf)
        return arrived_ms + seam + node.cost_ms(self._costs) + rest > self._limit


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
    unmeasured = own + _unmeasured_seam_ms(costs, relayed=bool(relayed))
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
