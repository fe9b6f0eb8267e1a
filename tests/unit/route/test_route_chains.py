"""The prefix chain a gateway sends with a route request (route.kv_plan.RouteChains): keyed like
the chain the route's probe and shards use, learnt per model from the routes given before."""

from __future__ import annotations

from meshnet.core.events import RouteHop
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import NodeId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeCapability
from meshnet.core.prefix import PrefixKey, prefix_chain, prompt_namespace
from meshnet.core.tracking import MAX_ROUTE_CHAIN, Route
from meshnet.route.kv_plan import RouteChains

CHUNK = 8


def _route(fingerprint: str = "rcp-x") -> Route:
    capability = NodeCapability(4096, CHUNK, 4096, 1 << 20, 8, 4)
    hop = RouteHop(NodeId("h"), "h:1", LayerRange(0, 6), capability)
    return Route((hop,), 1, "tiny", "Q8_0", fingerprint, 6, 1.0)


def test_the_first_request_of_a_model_sends_no_chain_and_later_ones_send_the_routes() -> None:
    chains = RouteChains()
    request = GenerationRequest(tuple(range(3, 40)), 4, model="tiny")
    assert chains.chain(request) == ()
    chains.learn("tiny", _route())
    assert chains.chain(request) == prefix_chain(PrefixKey("rcp-x", CHUNK), request.prompt_tokens)
    assert len(chains.chain(request)) == 37 // CHUNK
    salted = GenerationRequest(request.prompt_tokens, 4, model="tiny", cache_salt="tenant")
    assert chains.chain(salted) == prefix_chain(
        PrefixKey("rcp-x", CHUNK, prompt_namespace("tenant")), request.prompt_tokens
    )
    assert chains.chain(GenerationRequest(request.prompt_tokens, 4, model="other")) == ()


def test_chains_are_bounded_and_mixed_device_routes_teach_nothing() -> None:
    chains = RouteChains(max_models=1)
    chains.learn("tiny", _route())
    long = GenerationRequest(tuple(i % 900 + 3 for i in range(CHUNK * (MAX_ROUTE_CHAIN + 5))), 4, model="tiny")
    assert len(chains.chain(long)) == MAX_ROUTE_CHAIN
    chains.learn("other", _route("rcf-family"))
    assert chains.chain(GenerationRequest((1, 2), 4, model="other")) == ()
    chains.learn("other", _route())
    assert chains.chain(long) == (), "one model remembered: the oldest forgotten"
