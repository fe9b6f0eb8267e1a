"""The route planner's cost model: what one node and one seam cost a decoded token.

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

Kept apart from the search (``tracker.routing``), which only adds these costs up: the views
the planner reads and how each is priced are what the registry, the route index, the believed
speeds (``tracker.claims``) and prefix routes (``tracker.affinity``) share with it.
Everything here is a function of its arguments: no clock, no registry, no I/O.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType

from meshnet.core.addresses import is_relayed
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
        return unmeasured_seam_ms(costs, relayed=relayed)
    return measured + costs.seam_overhead_ms


def unmeasured_seam_ms(costs: RoutingCosts, *, relayed: bool) -> float:
    """A seam no probe measured: the default latency (two legs and a crossing into a relayed
    node), plus the per-seam overhead."""
    measured = 2 * costs.default_latency_ms + costs.relay_crossing_ms if relayed else costs.default_latency_ms
    return measured + costs.seam_overhead_ms
