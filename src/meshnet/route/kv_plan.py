"""How much of a prompt's KV a route reuses: ask every hop what it holds, reuse what all hold.

A prefix reused on one shard is useless without it on every shard after it (their rows for it
are never computed), so the session starts where the shortest held prefix ends, and every hop
restores exactly that (``node.kv_reuse``). Each hop leases what it answered for the session
about to open; if one evicted it anyway, its opening fails with ``PrefixEvicted`` and the driver
opens the session again without reuse. A hop that does not answer the probe in time counts as
holding nothing: a probe never fails a request.

Before there is a route, the tracker is sent the prompt's chain too (``RouteChains``), so it can
prefer a route whose head holds a prefix of it; the chain's recipe and chunk are learnt from the
routes given before for the same model (the first request of a model sends none).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace

import grpc

from meshnet.core.devices import route_numerics
from meshnet.core.events import RouteAccepted, RouteHop
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import RequestId, SessionId
from meshnet.core.prefix import KvPlan, PrefixKey, prefix_chain, prompt_namespace
from meshnet.core.recipe import FAMILY_PREFIX
from meshnet.core.snapshot import tokens_link
from meshnet.core.tracking import MAX_ROUTE_CHAIN, Route
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire.kv_wire import held_kv_to_proto

PROBE_TIMEOUT_S = 1.0
MAX_KNOWN_MODELS = 64


def route_accepted(request_id: RequestId, session_id: SessionId, route: Route, plan: KvPlan | None) -> RouteAccepted:
    """What a request is told when ``route`` takes it: its hops, numerics and the tokens ``plan`` reuses."""
    numerics = route_numerics(route.fingerprint, tuple(hop.capability.drift for hop in route.hops))
    cached = 0 if plan is None else plan.reused_blocks * route.hops[0].capability.prefill_chunk_tokens
    return RouteAccepted(
        request_id, session_id, route.model, route.quantization, route.hops, route.epoch, numerics, cached
    )


class RouteChains:
    """The prefix chain a route request carries, by the recipe and chunk last routed per model."""

    def __init__(self, max_models: int = MAX_KNOWN_MODELS) -> None:
        self._max = max_models
        self._keys: OrderedDict[str, tuple[str, int]] = OrderedDict()

    def learn(self, model: str, route: Route) -> None:
        """Note how ``route`` (given for ``model``) keys prompts; a mixed-device route keys none."""
        if route.fingerprint.startswith(FAMILY_PREFIX) or not route.hops:
            return
        self._keys[model] = (route.fingerprint, route.hops[0].capability.prefill_chunk_tokens)
        self._keys.move_to_end(model)
        while len(self._keys) > self._max:
            self._keys.popitem(last=False)

    def chain(self, request: GenerationRequest) -> tuple[bytes, ...]:
        """``request``'s prompt chain, at most ``MAX_ROUTE_CHAIN`` links; empty: model not seen yet."""
        known = self._keys.get(request.model)
        return () if known is None else _route_chain(*known, request)


def route_chain(route: Route, request: GenerationRequest) -> tuple[bytes, ...]:
    """``request``'s prompt chain as ``route`` keys prompts (what a route request carries), at most
    ``MAX_ROUTE_CHAIN`` links; empty on a mixed-device route, which keys none."""
    if route.fingerprint.startswith(FAMILY_PREFIX) or not route.hops:
        return ()
    return _route_chain(route.fingerprint, route.hops[0].capability.prefill_chunk_tokens, request)


def _route_chain(fingerprint: str, chunk: int, request: GenerationRequest) -> tuple[bytes, ...]:
    key = PrefixKey(fingerprint, chunk, prompt_namespace(request.cache_salt))
    return prefix_chain(key, request.prompt_tokens, limit=MAX_ROUTE_CHAIN * chunk)


def reuse_plan(chain: tuple[bytes, ...], held: Sequence[int], prompt_tokens: int, chunk: int, namespace: str) -> KvPlan:
    """The plan for a prompt of ``prompt_tokens`` whose whole chunks link as ``chain``, when the
    hops hold ``held`` blocks of it: reuse what all hold, but leave the prompt's last token to
    compute (the tail samples from its logits); keep the whole chain where it is not all reused."""
    reused = min(held, default=0)
    if reused * chunk >= prompt_tokens:
        reused = max(0, (prompt_tokens - 1) // chunk)
    save = len(chain) if len(chain) > reused else 0
    return KvPlan(chain, reused, save, namespace)


async def plan_for(
    pool: ChannelPool, hops: Sequence[RouteHop], fingerprint: str, request: GenerationRequest
) -> KvPlan | None:
    """The route's plan for ``request``'s prompt; None where nothing can be reused or kept (a
    prompt shorter than a chunk, a mixed-device route, hops cutting prompts differently)."""
    chunks = {hop.capability.prefill_chunk_tokens for hop in hops}
    if fingerprint.startswith(FAMILY_PREFIX) or len(chunks) != 1:
        return None
    chunk = chunks.pop()
    namespace = prompt_namespace(request.cache_salt)
    chain = prefix_chain(PrefixKey(fingerprint, chunk, namespace), request.prompt_tokens)
    if not chain:
        return None
    held = await asyncio.gather(*(_held(pool, hop, fingerprint, chain) for hop in hops))
    plan = reuse_plan(chain, held, len(request.prompt_tokens), chunk, namespace)
    if not plan.reused_blocks:
        return plan
    # The head binds the session's KV snapshots to its tokens from where the reused KV ends.
    return replace(plan, tokens_link=tokens_link(request.prompt_tokens[: plan.reused_blocks * chunk]))


async def _held(pool: ChannelPool, hop: RouteHop, fingerprint: str, chain: tuple[bytes, ...]) -> int:
    try:
        reply = await pool.stub(hop.address, hop.node_id).HeldKv(
            held_kv_to_proto(fingerprint, chain), timeout=PROBE_TIMEOUT_S
        )
    except grpc.RpcError:
        return 0
    return min(int(reply.blocks), len(chain))
