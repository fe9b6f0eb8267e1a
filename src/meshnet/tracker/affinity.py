"""Prefix affinity: send a prompt to the route whose head holds the longest prefix of it, unless
that route's load costs more than the prefill the prefix saves (Mesh-LLM's and SGLang's
prefix-aware routing, on this planner's cost model).

A head announces the tips of the prompt prefixes it stores (``NodeLoad.prefix_tips``: each
one's last chain link and its length in blocks, ``core.prefix``), and a request carries its
prompt's chain, so "holds a prefix of this prompt" is a lookup of each link among the tips. A
route is then weighed by what the request is expected to cost on it, in milliseconds:

    ms_per_token * REPLY_TOKENS  +  (prompt tokens - held tokens) * prefill ms per prompt token

where ``ms_per_token`` is the planner's estimate (compute times the queue, plus the penalty of a
full node, ``tracker.routing``). A route with a full hop is never chosen for its prefix: an
idle route computing the whole prompt beats a saturated one holding all of it.

Tips are believed only for this preference. A head that announces prefixes it does not hold
gets traffic it then serves cold (the route's probe, ``route.kv_plan``, decides what is really
reused), and what it can gain is bounded: a prompt token saved is worth at most one decode
step of the route, however slow a prefill the head claims.

``ConversationRoutes`` adds stickiness: the route issued for a request's last chain link, kept
for a while, is given again to a later request whose chain contains that link (the next turn
of the conversation) while all its nodes live and have room, since the head's next heartbeat
may not have announced the new prefix yet.

Everything but ``ConversationRoutes`` (the tracker's record, one event loop) is a pure function.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from meshnet.core.errors import NoRoute
from meshnet.core.ids import NodeId
from meshnet.tracker.route_costs import (
    DEFAULT_COSTS,
    NO_LATENCIES,
    LatencyTable,
    NodeView,
    RoutingCosts,
    compute_ms,
    node_cost_ms,
    seam_cost_ms,
)
from meshnet.tracker.routing import RoutePlan, choose_route

REPLY_TOKENS = 128
"""Decoded tokens a request is taken to produce, to weigh a route's cost per decoded token
against the prefill a held prefix saves once (a typical chat turn's answer)."""
CONVERSATION_TTL_S = 600.0
MAX_CONVERSATIONS = 8192

Tips = Mapping[NodeId, Mapping[bytes, int]]
"""Each head's announced prefixes: last chain link -> length in blocks."""


@dataclass(frozen=True)
class PrefixRouting:
    """What the planner needs of a request's prompt and the heads' announcements."""

    chain: tuple[bytes, ...]
    tips: Tips


def held_blocks(tips: Mapping[bytes, int], chain: Sequence[bytes]) -> int:
    """The longest prefix of ``chain`` (in blocks) that ``tips`` say is held; 0: none."""
    for blocks in range(len(chain), 0, -1):
        if tips.get(chain[blocks - 1]) == blocks:
            return blocks
    return 0


def prefill_ms_per_token(hops: Sequence[NodeView], costs: RoutingCosts = DEFAULT_COSTS) -> float:
    """Milliseconds one prompt token costs on a route: each hop's claimed prefill rate, but never
    more than its believed decode step (a batched prompt token is not slower than a decoded one)."""
    total = 0.0
    for view in hops:
        step_ms = compute_ms(view, costs)
        claim = view.record.capability.prefill_tokens_per_s
        total += min(1000.0 / claim, step_ms) if claim > 0 else step_ms
    return total


def expected_ms(plan: RoutePlan, views: Mapping[NodeId, NodeView], prefix: PrefixRouting, costs: RoutingCosts) -> float:
    """What a request is expected to cost on ``plan``: its reply, and the prompt its head lacks."""
    hops = [views[hop.node_id] for hop in plan.hops]
    chunk = hops[0].record.capability.prefill_chunk_tokens
    held = held_blocks(prefix.tips.get(hops[0].node_id, {}), prefix.chain)
    missing_tokens = (len(prefix.chain) - held) * chunk
    return plan.ms_per_token * REPLY_TOKENS + missing_tokens * prefill_ms_per_token(hops, costs)


def has_room(plan: RoutePlan, views: Mapping[NodeId, NodeView]) -> bool:
    return all(views[hop.node_id].free_sessions > 0 for hop in plan.hops)


def prefer_held_prefix(
    base: RoutePlan,
    nodes: Sequence[NodeView],
    prefix: PrefixRouting,
    *,
    latency_ms: LatencyTable = NO_LATENCIES,
    exclude: Collection[NodeId] = frozenset(),
    costs: RoutingCosts = DEFAULT_COSTS,
) -> RoutePlan:
    """``base`` (the planner's cheapest route), or the route through a head holding a prefix of
    the prompt where that is expected to cost less (``expected_ms``) and has room on every hop."""
    if not prefix.chain:
        return base
    views = {node.node_id: node for node in nodes}
    best, best_ms = base, expected_ms(base, views, prefix, costs)
    for head in _holders(nodes, base, prefix, exclude):
        plan = _route_through(head, nodes, latency_ms, exclude, costs)
        if plan is None or not has_room(plan, views):
            continue
        cost = expected_ms(plan, views, prefix, costs)
        if cost < best_ms:
            best, best_ms = plan, cost
    return best


def _holders(
    nodes: Sequence[NodeView], base: RoutePlan, prefix: PrefixRouting, exclude: Collection[NodeId]
) -> list[NodeView]:
    """Live heads of the base route's model that announce a prefix of the prompt."""
    return sorted(
        (
            node
            for node in nodes
            if node.layers.start == 0
            and base.model in (node.model, node.fingerprint)
            and node.node_id not in exclude
            and node.node_id != base.hops[0].node_id
            and held_blocks(prefix.tips.get(node.node_id, {}), prefix.chain) > 0
        ),
        key=lambda node: node.node_id,
    )


def _route_through(
    head: NodeView,
    nodes: Sequence[NodeView],
    latency_ms: LatencyTable,
    exclude: Collection[NodeId],
    costs: RoutingCosts,
) -> RoutePlan | None:
    """The cheapest route of ``head``'s recipe that starts at ``head``; None: none."""
    others = {
        node.node_id
        for node in nodes
        if node.layers.start == 0 and node.fingerprint == head.fingerprint and node.node_id != head.node_id
    }
    try:
        return choose_route(
            nodes, head.n_layers, head.fingerprint, latency_ms=latency_ms, exclude={*exclude, *others}, costs=costs
        )
    except NoRoute:
        return None


def plan_of(
    node_ids: Sequence[NodeId],
    nodes: Sequence[NodeView],
    model: str,
    *,
    latency_ms: LatencyTable = NO_LATENCIES,
    exclude: Collection[NodeId] = frozenset(),
    costs: RoutingCosts = DEFAULT_COSTS,
) -> RoutePlan | None:
    """The route over exactly ``node_ids`` as the nodes are now: None unless each is live, not
    excluded, has room, and together they still form a whole route of ``model``."""
    views = {node.node_id: node for node in nodes}
    chain = [views.get(node_id) for node_id in node_ids]
    hops = [view for view in chain if view is not None and view.node_id not in exclude and view.free_sessions > 0]
    if not hops or len(hops) != len(node_ids):
        return None
    first, last = hops[0], hops[-1]
    meet = all(a.layers.stop == b.layers.start for a, b in itertools.pairwise(hops))
    same = all(view.fingerprint == first.fingerprint for view in hops)
    whole = first.layers.start == 0 and last.layers.stop == first.n_layers
    if not (meet and same and whole and model in (first.model, first.fingerprint)):
        return None
    ms = sum(node_cost_ms(view, costs) for view in hops)
    seams = itertools.pairwise(hops)
    ms += sum(seam_cost_ms(a.node_id, b.node_id, latency_ms, costs, relayed=b.relayed) for a, b in seams)
    record = first.record
    return RoutePlan(
        record.model, record.quantization, first.fingerprint, first.n_layers, tuple(v.hop() for v in hops), ms
    )


class ConversationRoutes:
    """Routes issued for requests' last chain links, by link: bounded, forgotten after a TTL.
    Memory only: call from one event loop."""

    def __init__(self, *, ttl_s: float = CONVERSATION_TTL_S, max_entries: int = MAX_CONVERSATIONS) -> None:
        self._ttl_s = ttl_s
        self._max = max_entries
        self._routes: OrderedDict[bytes, tuple[tuple[NodeId, ...], float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._routes)

    def remember(self, chain: Sequence[bytes], node_ids: tuple[NodeId, ...], now: float) -> None:
        if not chain:
            return
        self._routes[chain[-1]] = (node_ids, now)
        self._routes.move_to_end(chain[-1])
        while len(self._routes) > self._max:
            self._routes.popitem(last=False)

    def recall(self, chain: Sequence[bytes], now: float) -> tuple[NodeId, ...] | None:
        """The route issued for the longest prefix of ``chain`` seen within the TTL; None: none."""
        while self._routes:
            oldest, (_, at) = next(iter(self._routes.items()))
            if now - at < self._ttl_s:
                break
            del self._routes[oldest]
        for link in reversed(chain):
            found = self._routes.get(link)
            if found is not None:
                return found[0]
        return None
