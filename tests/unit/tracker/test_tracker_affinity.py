"""Prefix affinity (tracker.affinity): a route whose head holds a prefix of the prompt is chosen
when the prefill it saves outweighs its load; conversations keep their route while it holds.

The sample capability's chunk is 256 tokens, its decode 100 tok/s (10 ms a step) and its claimed
prefill 1,000 tok/s (1 ms a prompt token), so a held block saves 256 ms, and a request queued
ahead costs 10 ms x REPLY_TOKENS (1,280 ms): six blocks outweigh one queued request, five do not.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest
from manual_clock import ManualClock
from tracker_samples import MODEL, OTHER_RECIPE, registration, view

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId, SessionId
from meshnet.core.prefix import PrefixKey, prefix_chain
from meshnet.core.tracking import MAX_PREFIX_TIPS, MAX_ROUTE_CHAIN, NodeLoad, RouteQuery
from meshnet.tracker.affinity import (
    CONVERSATION_TTL_S,
    ConversationRoutes,
    PrefixRouting,
    held_blocks,
    plan_of,
    prefer_held_prefix,
    prefill_ms_per_token,
)
from meshnet.tracker.registry import NodeRegistry
from meshnet.tracker.route_costs import NodeView
from meshnet.tracker.routing import choose_model_route

CHAIN = prefix_chain(PrefixKey("recipe", 4), list(range(40)))
"""Ten links: a prompt of ten whole chunks."""


def _tips(blocks: int, chain: tuple[bytes, ...] = CHAIN) -> dict[bytes, int]:
    return {chain[blocks - 1]: blocks}


def _choose(nodes: list[NodeView], tips: dict[str, dict[bytes, int]], chain: tuple[bytes, ...] = CHAIN) -> list[str]:
    base = choose_model_route(nodes, MODEL)
    prefix = PrefixRouting(chain, {NodeId(node_id): held for node_id, held in tips.items()})
    return [str(hop.node_id) for hop in prefer_held_prefix(base, nodes, prefix).hops]


def test_held_blocks_is_the_longest_prefix_a_tip_names_with_its_own_length() -> None:
    tips = {CHAIN[2]: 3, CHAIN[6]: 7}
    assert held_blocks(tips, CHAIN) == 7
    assert held_blocks(tips, CHAIN[:5]) == 3
    assert held_blocks({CHAIN[6]: 5}, CHAIN) == 0, "a tip must be the chain's link at its own length"
    assert held_blocks(tips, ()) == 0


def test_the_head_holding_a_prefix_wins_between_equal_routes() -> None:
    nodes = [view("a", 0, 20), view("b", 0, 20)]
    assert _choose(nodes, {}) == ["a"], "the planner's tie goes to the first id"
    assert _choose(nodes, {"b": _tips(2)}) == ["b"]
    assert _choose(nodes, {"a": _tips(2), "b": _tips(6)}) == ["b"], "the longest held prefix wins"


def test_a_saturated_holder_loses_to_an_idle_route_that_holds_nothing() -> None:
    nodes = [view("a", 0, 20), view("b", 0, 20, free_sessions=0)]
    assert _choose(nodes, {"b": _tips(10)}) == ["a"]


def test_the_prefill_saved_is_weighed_against_the_holders_queue() -> None:
    nodes = [view("a", 0, 20), view("b", 0, 20, queue_depth=1)]
    assert _choose(nodes, {"b": _tips(4)}) == ["a"], "4 x 256 ms saved < one queued request (1,280 ms)"
    assert _choose(nodes, {"b": _tips(5)}) == ["a"], "5 x 256 ms saved = one queued request: a tie stays"
    assert _choose(nodes, {"b": _tips(6)}) == ["b"], "6 x 256 ms saved > one queued request"


def test_a_prompt_token_costs_at_most_a_decode_step_whatever_prefill_is_claimed() -> None:
    node = view("b", 0, 20)
    slow = replace(node.record.capability, prefill_tokens_per_s=0.001)
    assert prefill_ms_per_token([replace(node, record=replace(node.record, capability=slow))]) == pytest.approx(10.0)
    assert prefill_ms_per_token([node, view("c", 10, 20)]) == pytest.approx(2.0), "1 ms a token on each hop"


def test_a_head_announcing_the_whole_prompt_gains_no_more_than_its_prefill_elsewhere() -> None:
    """What a lying head can win is bounded by what the prompt costs on the honest route
    (10 blocks x 256 tokens x 1 ms = two queued requests): past that, its queue sends work away."""
    tips = {"b": _tips(10)}
    assert _choose([view("a", 0, 20), view("b", 0, 20, queue_depth=1)], tips) == ["b"]
    assert _choose([view("a", 0, 20), view("b", 0, 20, queue_depth=3)], tips) == ["a"]


def test_a_holder_is_routed_through_with_the_best_tail_and_other_recipes_are_ignored() -> None:
    nodes = [
        view("h1", 0, 10),
        view("h2", 0, 10),
        view("t1", 10, 20),
        view("t2", 10, 20, rate=50),
        view("x", 0, 20, recipe=OTHER_RECIPE, rate=5),
    ]
    assert _choose(nodes, {"h2": _tips(3)}) == ["h2", "t1"]
    assert _choose(nodes, {"x": _tips(10)}) == ["h1", "t1"], "holding all of it does not make up 200 ms a token"
    assert _choose([*nodes[:4], replace(nodes[4], decode_tokens_per_s=20)], {"x": _tips(10)}) == ["x"]


def test_no_chain_or_no_holder_keeps_the_planners_route() -> None:
    nodes = [view("a", 0, 20, rate=50), view("b", 0, 20)]
    assert _choose(nodes, {"a": _tips(10)}, chain=()) == ["b"]
    assert _choose(nodes, {}) == ["b"]


def test_plan_of_rebuilds_a_route_only_while_every_node_is_live_with_room() -> None:
    nodes = [view("h", 0, 10), view("t", 10, 20), view("full", 10, 20, free_sessions=0)]
    ids = (NodeId("h"), NodeId("t"))
    plan = plan_of(ids, nodes, MODEL)
    assert plan is not None and [hop.node_id for hop in plan.hops] == list(ids)
    assert plan_of(ids, nodes, MODEL, exclude={NodeId("t")}) is None
    assert plan_of((NodeId("h"), NodeId("full")), nodes, MODEL) is None
    assert plan_of((NodeId("h"), NodeId("gone")), nodes, MODEL) is None
    assert plan_of((NodeId("h"),), nodes, MODEL) is None, "half a route"
    assert plan_of(ids, nodes, "another-model") is None


def test_conversation_routes_recall_the_longest_seen_link_within_their_ttl_and_bound() -> None:
    routes = ConversationRoutes(ttl_s=600.0, max_entries=2)
    first, later = (NodeId("a"),), (NodeId("b"),)
    routes.remember(CHAIN[:3], first, now=0.0)
    routes.remember(CHAIN[:6], later, now=10.0)
    assert routes.recall(CHAIN, now=20.0) == later
    assert routes.recall(CHAIN[:5], now=20.0) == first
    assert routes.recall(CHAIN[:2], now=20.0) is None
    assert routes.recall(CHAIN[:5], now=600.0) is None, "forgotten after its TTL"
    assert routes.recall(CHAIN, now=600.0) == later
    routes.remember(CHAIN[:1], first, now=601.0)
    routes.remember(CHAIN[:2], first, now=602.0)
    assert len(routes) == 2 and routes.recall(CHAIN[:6], now=603.0) == first, "bounded: the oldest dropped"


def test_tips_and_route_chains_are_bounded_values() -> None:
    link = hashlib.sha256(b"x").digest()[:16]
    with pytest.raises(InvalidArgument):
        NodeLoad(prefix_tips=tuple((link, 1) for _ in range(MAX_PREFIX_TIPS + 1)))
    with pytest.raises(InvalidArgument):
        NodeLoad(prefix_tips=((b"short", 1),))
    with pytest.raises(InvalidArgument):
        NodeLoad(prefix_tips=((link, 0),))
    with pytest.raises(InvalidArgument):
        RouteQuery(MODEL, prefix_chain=(link,) * (MAX_ROUTE_CHAIN + 1))
    with pytest.raises(InvalidArgument):
        RouteQuery(MODEL, prefix_chain=(b"short",))


# -- in the registry: tips from heartbeats, conversations kept on their route ---------------------


def _registry(clock: ManualClock) -> tuple[NodeRegistry, NodeId, NodeId]:
    registry = NodeRegistry(clock=clock, heartbeat_interval_s=2.0)
    a = registry.register(registration(0, 20, address="a:1"), NodeId("a"))
    b = registry.register(registration(0, 20, address="b:1"), NodeId("b"))
    return registry, a, b


def _route(registry: NodeRegistry, chain: tuple[bytes, ...], session: str = "s", **query: object) -> str:
    asked = RouteQuery(MODEL, SessionId(session), prefix_chain=chain, **query)  # type: ignore[arg-type]
    return str(registry.choose_route(asked).node_ids[0])


def test_a_head_announcing_a_prefix_in_its_heartbeat_draws_the_prompt_until_it_leaves() -> None:
    clock = ManualClock(1000.0)
    registry, a, b = _registry(clock)
    audit = {"unbilled": True}  # not remembered as a conversation: only the tips steer these
    assert _route(registry, CHAIN, "s1", **audit) == a
    registry.heartbeat(b, NodeLoad(free_sessions=8, prefix_tips=((CHAIN[3], 4),)))
    assert _route(registry, CHAIN[:6], "s2", **audit) == b
    assert _route(registry, CHAIN[:3], "s3", **audit) == a, "b holds nothing shorter than 4 blocks"
    registry.deregister(b)
    registry.register(registration(0, 20, address="b:1"), b)
    assert _route(registry, CHAIN[:6], "s4", **audit) == a, "the tips went with the node"


def test_a_conversation_keeps_its_route_while_it_lives_and_has_room() -> None:
    clock = ManualClock(1000.0)
    registry, a, b = _registry(clock)
    assert _route(registry, CHAIN[:2], "turn-1") == a
    # a is now busier than b: the planner alone would move the next turn.
    registry.heartbeat(a, NodeLoad(free_sessions=6, queue_depth=2))
    registry.heartbeat(b, NodeLoad(free_sessions=8))
    assert _route(registry, (), "other") == b
    assert _route(registry, CHAIN[:4], "turn-2") == a, "the next turn contains the last turn's link"
    assert _route(registry, CHAIN[:1], "other-2") == b, "a shorter chain is another conversation"
    registry.heartbeat(a, NodeLoad(free_sessions=0))
    assert _route(registry, CHAIN[:6], "turn-3") == b, "a full route is not kept"
    registry.heartbeat(a, NodeLoad(free_sessions=6, queue_depth=2))
    assert _route(registry, CHAIN[:8], "turn-4") == b, "turn 3 moved the conversation to b"
    assert _route(registry, CHAIN[:8], "turn-5", exclude=frozenset({b})) == a


def test_a_conversation_is_forgotten_after_its_ttl_and_audits_are_not_remembered() -> None:
    clock = ManualClock(1000.0)
    registry, a, b = _registry(clock)
    assert _route(registry, CHAIN[:2], "turn-1") == a
    assert _route(registry, CHAIN[:3], "audit", unbilled=True) == a
    registry.heartbeat(a, NodeLoad(free_sessions=6, queue_depth=2))
    registry.heartbeat(b, NodeLoad(free_sessions=8))
    assert _route(registry, CHAIN[:3], "replayed") == a, "kept by turn 1, not by the audit"
    for _ in range(int(CONVERSATION_TTL_S) + 1):
        clock.now += 1.0
        registry.heartbeat(a, NodeLoad(free_sessions=6, queue_depth=2))
        registry.heartbeat(b, NodeLoad(free_sessions=8))
    assert _route(registry, CHAIN[:4], "turn-2") == b
