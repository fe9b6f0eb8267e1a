"""Embed one input on the swarm: one prefill through a route, the tail's pooled vector back.

An embedding is a session that ends at its prefill: the opening frame asks the tail for an
embedding (``StepFrame.embedding``), the prompt's chunks go down the route as any prefill's (the
same frame sizes, so the same numerics), and the tail answers the final chunk with the pooled
final-norm row instead of a token. Closing the head stream then frees the session's KV on every
hop. A hop lost before the answer is failed over as a generation's is (``SwarmClient``'s probe
of the hops, a replacement route from the tracker) and the input is embedded again from its
first token: nothing of a lost route's prefill is kept.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from meshnet.core.embedding import Embedded, EmbeddingSpec
from meshnet.core.errors import ContextLengthExceeded, EngineError, MeshnetError, NoRoute, Unavailable, Unreachable
from meshnet.core.features import needed_features
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import NodeId, RequestId, SessionId, new_session_id
from meshnet.core.tickets import ticket_seconds
from meshnet.core.tracking import NodeWork, Route, WorkRecord, billing_units
from meshnet.membership.tracker_client import TrackerClient
from meshnet.route.driver import RouteDriver
from meshnet.route.features import capable_route
from meshnet.route.kv_plan import route_accepted
from meshnet.route.lost_hops import replacement_route
from meshnet.route.route_run import PrefillTally, RouteRun, RouteSession, send_prefill
from meshnet.route.shard_stream import ShardStream

LostHops = Callable[[MeshnetError, Route], Awaitable[frozenset[NodeId] | None]]
"""The hops to avoid if an error is recovered on a new route, None if it is not (``SwarmClient``)."""


async def embed_on_route(
    driver: RouteDriver, route: RouteSession, request: GenerationRequest, spec: EmbeddingSpec
) -> tuple[float, ...]:
    """The pooled embedding of ``request.prompt_tokens`` along ``route``; its session ends here."""
    deadline = None if request.timeout_s is None else time.monotonic() + request.timeout_s
    head = route.hops[0]
    left = None if deadline is None else deadline - time.monotonic()
    stream = ShardStream(driver.pool, head.address, left, head.node_id)
    try:
        run = RouteRun(route, request, deadline, stream, None, driver.budget, embedding=spec, progress=driver.progress)
        chunks = driver.prefill_chunks(request, route.hops, 0)
        tally = PrefillTally(len(request.prompt_tokens), time.perf_counter())
        async for _ in send_prefill(run, chunks, tally, last_continues=False):
            pass
        vector = None if tally.result is None else tally.result.embedding
        if vector is None:
            raise EngineError(f"the route through {head.address} answered the embedding's final chunk without one")
        return vector
    finally:
        stream.cancel()


class EmbeddingRun:
    """Embeds requests on routes the tracker gives, failing over as generations do."""

    def __init__(self, tracker: TrackerClient, driver: RouteDriver, lost_hops: LostHops, max_failovers: int) -> None:
        self._tracker = tracker
        self._driver = driver
        self._lost_hops = lost_hops
        self._max_failovers = max_failovers

    async def embed(
        self, request: GenerationRequest, spec: EmbeddingSpec, request_id: RequestId
    ) -> tuple[Embedded, WorkRecord]:
        """The vector of ``request``'s prompt with the route that computed it; the record that bills it."""
        session_id, started = new_session_id(), time.time()
        lasting = ticket_seconds(request.timeout_s)

        async def tracker_route(exclude: frozenset[NodeId]) -> Route:
            return await self._tracker.choose_route(
                request.model, session_id=session_id, request_id=request_id, ticket_seconds=lasting, exclude=exclude
            )

        async def ask(exclude: frozenset[NodeId]) -> Route:
            return await capable_route(tracker_route, needed_features(request, embedding=True), exclude)

        route, lost_at, failovers = await ask(frozenset()), dict[NodeId, str](), 0
        _check_context(route, len(request.prompt_tokens))
        while True:
            session = RouteSession(request_id, session_id, route.hops, route.fingerprint, route.epoch, route.ticket)
            try:
                vector = await embed_on_route(self._driver, session, request, spec)
                embedded = Embedded(vector, route_accepted(request_id, session_id, route, None))
                return embedded, _record(request_id, session_id, route, len(request.prompt_tokens), started)
            except MeshnetError as error:
                lost = None if failovers >= self._max_failovers else await self._lost_hops(error, route)
                if lost is None:
                    raise
                failovers += 1
                lost_at.update((hop.node_id, hop.address) for hop in route.hops if hop.node_id in lost)
                try:
                    route = await replacement_route(ask, lost_at)
                except (NoRoute, Unreachable) as no_route:
                    raise Unavailable(f"{error.message}; no replacement route: {no_route.message}") from None


def _check_context(route: Route, tokens: int) -> None:
    if tokens > route.context_tokens:
        raise ContextLengthExceeded(
            f"the input ({tokens} tokens) exceeds the {route.context_tokens}-token context each session "
            "has on this swarm's shards; shorten it"
        )


def _record(request_id: RequestId, session_id: SessionId, route: Route, tokens: int, started: float) -> WorkRecord:
    """The embedding's work record: every hop of the route that answered ran the input once."""
    return WorkRecord(
        request_id=request_id,
        model=route.model,
        status="completed",
        tokens_in=tokens,
        tokens_out=0,
        attribution=tuple(NodeWork(hop.node_id, hop.layers, tokens) for hop in route.hops),
        billing_units=billing_units(tokens, 0),
        started_at=started,
        finished_at=time.time(),
        session_id=session_id,
    )
