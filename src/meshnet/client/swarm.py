"""Serve one request on the swarm: route through the tracker, drive it, fail over, bill it.

Failover (the Petals design, with its position bookkeeping made explicit): when a shard is lost
mid-generation, the dead hops are found by probing, the tracker plans a route without them,
and the prompt plus every token generated so far is replayed onto it. Sampling is seeded by
position, so the continuation is exactly what the lost route would have produced.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from meshnet.client.route_driver import RouteDriver, RouteSession
from meshnet.client.shard_admin import fetch_capability
from meshnet.client.shard_stream import ChannelPool
from meshnet.client.tracker_client import TrackerClient
from meshnet.core.errors import (
    CacheMiss,
    ContextLengthExceeded,
    DeadlineExceeded,
    MeshnetError,
    NoRoute,
    Unavailable,
)
from meshnet.core.events import Finished, GenerationEvent, RouteAccepted, RouteHealth, TokenGenerated
from meshnet.core.generation import FinishReason, GenerationRequest
from meshnet.core.ids import NodeId, RequestId, SessionId, new_session_id
from meshnet.core.tracking import NodeWork, Route, WorkRecord, WorkStatus

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 0.5
PREFILL_WEIGHT = 0.25
"""Billing: a prompt token costs a quarter of a generated one (prefill is batched, decode is not)."""


@dataclass(frozen=True)
class SwarmConfig:
    max_failovers: int = 2
    """Replacement routes tried after a shard is lost, before the request fails."""
    report_timeout_s: float = 5.0
    """Budget of one attempt to file a work record."""
    report_retry_for_s: float = 600.0
    """How long a record is retried while the tracker is unreachable (it restarts, or is moved)
    before it is logged as lost. Records are idempotent by request id, so retrying is safe."""
    report_backoff_s: tuple[float, float] = (0.25, 5.0)
    """First and longest wait between attempts to file a record."""


def billing_units(prompt_tokens: int, completion_tokens: int) -> float:
    return PREFILL_WEIGHT * prompt_tokens + completion_tokens


class SwarmClient:
    def __init__(self, tracker: TrackerClient, pool: ChannelPool, driver: RouteDriver, config: SwarmConfig) -> None:
        self.tracker = tracker
        self._pool = pool
        self._driver = driver
        self._config = config
        self._reports: set[asyncio.Task[None]] = set()

    async def generate(self, request: GenerationRequest, request_id: RequestId) -> AsyncIterator[GenerationEvent]:
        session_id = new_session_id()
        route = await self.tracker.choose_route(request.model, session_id=session_id)
        # Before anything is streamed: a request that cannot fit would otherwise run until the
        # first shard runs out of positions and fail as a retryable overload.
        await self._check_context(route, request)
        started = time.time()
        history: list[int] = []
        status: WorkStatus = "failed"
        attempts: list[tuple[Route, int]] = []
        """Each route tried, with how many tokens had been generated when it started."""
        try:
            yield _accepted(request_id, session_id, route)
            failovers = 0
            excluded: frozenset[NodeId] = frozenset()
            while True:
                attempts.append((route, len(history)))
                session = RouteSession(request_id, session_id, route.hops, route.fingerprint, route.epoch)
                try:
                    async for event in self._driver.run(session, request, history=tuple(history)):
                        if isinstance(event, TokenGenerated):
                            history.append(event.token_id)
                        yield event
                    break
                except MeshnetError as error:
                    lost = None if failovers >= self._config.max_failovers else await self._lost_hops(error, route)
                    if lost is None:
                        raise
                    failovers += 1
                    # A hop found dead stays excluded for the rest of the request: the tracker lists
                    # it until it misses enough heartbeats, and routing onto it again wastes a failover.
                    excluded |= lost
                    route = await self._replace(request, session_id, route, error, excluded)
                    replay = f"{error.message}; replaying {len(history)} token(s) onto a new route"
                    yield RouteHealth("failover", replay)
                    yield _accepted(request_id, session_id, route)
            reason: FinishReason = "stop" if history and history[-1] in request.stop_tokens else "length"
            status = "completed"
            yield Finished(
                reason,
                len(request.prompt_tokens),
                len(history),
                billing_units(len(request.prompt_tokens), len(history)),
            )
        except (asyncio.CancelledError, GeneratorExit):
            status = "cancelled"
            raise
        finally:
            record = WorkRecord(
                request_id=request_id,
                model=route.model,
                status=status,
                tokens_in=len(request.prompt_tokens),
                tokens_out=len(history),
                attribution=_attribution(attempts, len(request.prompt_tokens), len(history)),
                billing_units=billing_units(len(request.prompt_tokens), len(history)),
                started_at=started,
                finished_at=time.time(),
                session_id=session_id,
            )
            # Reporting must not be lost to the caller's cancellation, nor hold it up for long.
            task = asyncio.get_running_loop().create_task(self._report(record))
            self._reports.add(task)
            task.add_done_callback(self._reports.discard)

    async def _check_context(self, route: Route, request: GenerationRequest) -> None:
        answers = await asyncio.gather(
            *(self._driver.capability(hop.address) for hop in route.hops),
            return_exceptions=True,
        )
        known = []
        for answer in answers:
            if isinstance(answer, MeshnetError):
                continue  # a hop that cannot be asked is left to the driver, which fails over
            if isinstance(answer, BaseException):
                raise answer
            known.append(answer.n_ctx_per_session)
        context = min(known, default=None)
        prompt = len(request.prompt_tokens)
        if context is not None and prompt + request.max_tokens > context:
            advice = f"lower max_tokens to at most {context - prompt}" if prompt < context else "shorten the prompt"
            raise ContextLengthExceeded(
                f"prompt ({prompt} tokens) + max_tokens ({request.max_tokens}) exceeds the {context}-token "
                f"context each session has on this swarm's shards; {advice}"
            )

    async def _lost_hops(self, error: MeshnetError, route: Route) -> frozenset[NodeId] | None:
        """The hops to avoid if ``error`` is recovered by replay onto a new route; None if not.

        Lost state -- a dead or restarted shard, an evicted session -- is recovered by replay, and
        with no hop found dead the tracker may plan the same shards again, which is what a retry
        should do. An untyped error counts too when a hop probes dead: a shard relaying the death
        of the next one does not always know it was a death (gRPC fails a send on a broken
        transport with INTERNAL), and the probe, not the relayed code, tells a lost hop.
        """
        untyped = type(error) is MeshnetError
        if not (untyped or isinstance(error, Unavailable | CacheMiss)):
            return None
        dead = frozenset(await self._probe_dead(route))
        return None if untyped and not dead else dead

    async def _replace(
        self,
        request: GenerationRequest,
        session_id: SessionId,
        route: Route,
        error: MeshnetError,
        excluded: frozenset[NodeId],
    ) -> Route:
        hops = [hop.address for hop in route.hops]
        log.warning("route %s lost (%s); excluding %s", hops, error.message, sorted(excluded))
        try:
            return await self.tracker.choose_route(request.model, session_id=session_id, exclude=excluded)
        except NoRoute as no_route:
            # The client-visible fact is the lost worker; the missing replacement is why it stays lost.
            raise Unavailable(f"{error.message}; no replacement route: {no_route.message}") from None

    async def _probe_dead(self, route: Route) -> set[NodeId]:
        async def alive(address: str) -> bool:
            try:
                await fetch_capability(self._pool, address, timeout_s=PROBE_TIMEOUT_S)
                return True
            except MeshnetError:
                return False

        answers = await asyncio.gather(*(alive(h.address) for h in route.hops))
        return {hop.node_id for hop, ok in zip(route.hops, answers, strict=True) if not ok}

    async def drain_reports(self, timeout_s: float = 10.0) -> None:
        """Wait for work records still being reported (at shutdown), at most ``timeout_s``."""
        if not self._reports:
            return
        _, pending = await asyncio.wait(set(self._reports), timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            log.error("shutting down with %d work record(s) not acknowledged by the tracker", len(pending))

    async def _report(self, record: WorkRecord) -> None:
        # One attempt's budget is short, but a tracker restart can take longer: keep the record
        # and retry until it is acknowledged, or it would be lost to its contributors.
        deadline = time.monotonic() + self._config.report_retry_for_s
        delay, longest = self._config.report_backoff_s
        while True:
            try:
                await self.tracker.report_work(record, timeout_s=self._config.report_timeout_s)
                return
            except (Unavailable, DeadlineExceeded) as error:
                if time.monotonic() + delay > deadline:
                    log.error(
                        "work record %s lost: the tracker was unreachable for %.0f s (%s): %s",
                        record.request_id,
                        self._config.report_retry_for_s,
                        error.message,
                        record,
                    )
                    return
                log.warning(
                    "work record %s not filed yet (%s); retrying in %.2f s", record.request_id, error.message, delay
                )
            except MeshnetError as error:
                log.error("work record %s refused by the tracker: %s", record.request_id, error.message)
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, longest)


def _accepted(request_id: RequestId, session_id: SessionId, route: Route) -> RouteAccepted:
    return RouteAccepted(request_id, session_id, route.model, route.quantization, route.hops, route.epoch)


def _attribution(attempts: list[tuple[Route, int]], prompt: int, generated: int) -> tuple[NodeWork, ...]:
    """Tokens each node processed: every route ran the prompt, the tokens replayed onto it and
    the ones generated on it, that is the prompt plus all tokens up to where the next began."""
    totals: dict[NodeId, NodeWork] = {}
    ends = [start for _, start in attempts[1:]] + [generated]
    for (route, _), end in zip(attempts, ends, strict=True):
        for hop in route.hops:
            before = totals[hop.node_id].tokens if hop.node_id in totals else 0
            totals[hop.node_id] = NodeWork(hop.node_id, hop.layers, before + prompt + end)
    return tuple(totals.values())
