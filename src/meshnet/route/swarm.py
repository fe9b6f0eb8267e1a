"""Serve one request on the swarm: route through the tracker, drive it, fail over, bill it.

The request's life (its tokens, how it ends, its usage and bill) is a ``route.life.RequestLife``;
this module routes it, feeds it the driver's events in one loop, files its work record and
offers it to the audit.

Failover (the Petals design, with its position bookkeeping made explicit): when a shard is lost
mid-generation, the dead hops are found by probing, the tracker plans a route without them,
and the prompt plus every token generated so far is replayed onto it. Sampling is seeded by
position, so the continuation is exactly what the lost route would have produced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from meshnet.core.embedding import Embedded, EmbeddingSpec
from meshnet.core.errors import (
    CacheMiss,
    ContextLengthExceeded,
    MeshnetError,
    NoRoute,
    ResourceExhausted,
    RouteStale,
    StepTimedOut,
    Unavailable,
    Unreachable,
)
from meshnet.core.events import RouteHealth
from meshnet.core.features import needed_features
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import NodeId, RequestId, SessionId, new_session_id
from meshnet.core.prefix import KvPlan
from meshnet.core.snapshot import SnapshotPlan
from meshnet.core.tickets import ticket_seconds
from meshnet.core.tracking import NodeWork, Route, RouteTiming, WorkRecord, WorkStatus
from meshnet.membership.tracker_client import TrackerClient
from meshnet.route.audit import AuditCase, Auditor
from meshnet.route.driver import RouteDriver
from meshnet.route.embedding import EmbeddingRun
from meshnet.route.features import capable_route
from meshnet.route.kv_plan import RouteChains, route_accepted
from meshnet.route.life import LifeSink, RequestLife, TextPlug, lifetime
from meshnet.route.lost_hops import LostAt, replacement_route
from meshnet.route.outbox import WorkOutbox
from meshnet.route.route_run import RouteSession
from meshnet.route.shard_admin import is_serving
from meshnet.route.shard_stream import ChannelPool
from meshnet.route.warmup import TurnWarmer
from meshnet.route.work_reports import ReportPolicy, WorkReporter

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 0.5
TIMING_REPORT_TIMEOUT_S = 2.0
"""A route timing is a measurement, not a record: one try, and it is dropped if the tracker is slow."""
BUSY_BACKOFF_S = (0.05, 0.1, 0.2, 0.4, 0.8)
"""Waits before reopening a route whose shard was full at the opening (1.55 s in all): long
enough for a lagging release to land, short enough to stay inside any client's patience."""


@dataclass(frozen=True)
class SwarmConfig:
    max_failovers: int = 2
    """Replacement routes tried after a shard is lost, before the request fails."""
    reports: ReportPolicy = field(default_factory=ReportPolicy)
    """How work records are filed with the tracker."""
    warm_turns: bool = True
    """Once a turn completes, keep its answer's KV as prompt KV for the next turn (``route.warmup``)."""


class _Run:
    """One request's bookkeeping across failovers: its life, the route now, the routes tried."""

    def __init__(self, life: RequestLife, request_id: RequestId, session_id: SessionId, route: Route) -> None:
        self.life = life
        self.request = life.request
        self.request_id = request_id
        self.session_id = session_id
        self.route = route
        self.started = time.time()
        self.attempts: list[tuple[Route, int]] = []
        """Each route tried, with how many tokens had been generated when it started."""
        self._first_token: tuple[int, float] | None = None
        self._last_token: tuple[int, float] | None = None
        """(tokens generated, monotonic time) when the first and the latest token arrived."""

    def clock(self, tokens: int) -> None:
        """Note the time if ``tokens`` (the count generated so far) moved since the last call."""
        if tokens == 0 or (self._last_token is not None and self._last_token[0] == tokens):
            return
        self._last_token = (tokens, time.monotonic())
        if self._first_token is None:
            self._first_token = self._last_token

    def timing(self) -> RouteTiming | None:
        """The route's decode time per token, measured after the first token (its prefill), when
        one route served the whole request and generated at least two tokens."""
        if len(self.attempts) != 1 or self._first_token is None or self._last_token is None:
            return None
        (first, started), (last, ended) = self._first_token, self._last_token
        if last <= first:
            return None
        per_token_ms = (ended - started) * 1000.0 / (last - first)
        return RouteTiming(self.route.node_ids, per_token_ms, last - first + 1)

    def record(self, status: WorkStatus, finished_at: float) -> WorkRecord:
        """The work record: tokens and billing are the life's usage, the very numbers the client got."""
        usage = self.life.usage
        attempts = self.attempts or [(self.route, 0)]
        return WorkRecord(
            request_id=self.request_id,
            model=self.route.model,
            status=status,
            tokens_in=usage.prompt_tokens,
            tokens_out=usage.completion_tokens,
            attribution=_attribution(attempts, usage.prompt_tokens, usage.completion_tokens),
            billing_units=usage.billing_units,
            started_at=self.started,
            finished_at=finished_at,
            session_id=self.session_id,
        )


class SwarmClient:
    def __init__(
        self,
        tracker: TrackerClient,
        pool: ChannelPool,
        driver: RouteDriver,
        config: SwarmConfig,
        *,
        outbox: WorkOutbox | None = None,
        auditor: Auditor | None = None,
    ) -> None:
        self.tracker = tracker
        self.auditor = auditor
        self._pool = pool
        self._driver = driver
        self._config = config
        self.reports = WorkReporter(tracker, config.reports, outbox)
        self._timings: set[asyncio.Task[None]] = set()
        self._chains = RouteChains()
        self._warmer = TurnWarmer(tracker, driver, enabled=config.warm_turns)

    async def serve(self, request: GenerationRequest, request_id: RequestId, text: TextPlug, sink: LifeSink) -> None:
        """Serve ``request`` to its end, pushing its items into ``sink`` as they happen.

        Returns once the request ended and its route was released; the last item in ``sink`` is
        its ``Outcome`` or ``Failure`` (a failure is never raised). Cancelling the caller's task
        cancels the route (its ``Failure`` is then ``Cancelled``) and re-raises.
        """
        life = RequestLife(request, text, sink)
        run: _Run | None = None
        try:
            async with lifetime(life):
                await self._warmer.settle(request.prompt_tokens)  # its history's rows, if being kept
                session_id = new_session_id()
                # The request id lets the tracker hold the record to the route it issued (a
                # failover's route joins it under the same session id) and names its ticket's request.
                lasting = ticket_seconds(request.timeout_s)

                async def ask(exclude: frozenset[NodeId]) -> Route:
                    return await self.tracker.choose_route(
                        request.model,
                        session_id=session_id,
                        request_id=request_id,
                        ticket_seconds=lasting,
                        prefix_chain=self._chains.chain(request),
                        exclude=exclude,
                    )

                # Only through a tail that serves what the request needs (an old one would ignore it).
                route = await capable_route(ask, needed_features(request))
                self._chains.learn(request.model, route)
                # Before anything is streamed: a request that cannot fit would otherwise run until
                # the first shard runs out of positions and fail as a retryable overload.
                self._check_context(route, request)
                run = _Run(life, request_id, session_id, route)
                # Written ahead: if this process dies mid-request, the record still exists (unverified).
                await self.reports.write_ahead(run.record("unverified", run.started))
                await self._follow(run)
        finally:
            if run is not None:
                self.reports.file(run.record(life.status, time.time()))
                if life.status == "completed":
                    self._offer_audit(run)
                    self._report_timing(run.timing())
                    self._warmer.offer(request, life.tokens, run.route)

    async def embed(self, request: GenerationRequest, spec: EmbeddingSpec, request_id: RequestId) -> Embedded:
        """The pooled embedding of ``request``'s prompt, with failover (``route.embedding``), billed."""
        embedding = EmbeddingRun(self.tracker, self._driver, self._lost_hops, self._config.max_failovers)
        embedded, record = await embedding.embed(request, spec, request_id)
        self.reports.file(record)
        return embedded

    async def _follow(self, run: _Run) -> None:
        """Drive ``run`` until its life is finished, replaying it onto a new route when a shard is lost.

        This is the request's one loop: each event of the route driver goes straight into the
        life, which decides when the request is done; leaving the loop closes the driver, which
        releases the route's session.
        """
        life, failovers = run.life, 0
        lost_at: dict[NodeId, str] = {}
        busy_waits = iter(BUSY_BACKOFF_S)
        noted: Route | None = None  # each route is noted accepted once, with the prompt KV its hops hold
        while True:
            run.attempts.append((run.route, len(life.tokens)))
            route, produced = run.route, len(life.tokens)
            session = RouteSession(
                run.request_id, run.session_id, route.hops, route.fingerprint, route.epoch, route.ticket
            )
            history = tuple(life.tokens)
            plan, snapshot = await self._kv_for(session, run.request, history, resuming=failovers > 0)
            if route is not noted:
                life.note(route_accepted(run.request_id, run.session_id, route, plan))
                noted = route
            events = self._driver.run(session, run.request, history=history, kv=plan, snapshot=snapshot)
            try:
                async with contextlib.aclosing(events):
                    async for event in events:
                        done = life.observe(event)
                        run.clock(len(life.tokens))
                        if done:
                            return
                return
            except ResourceExhausted:
                # A shard past the head can still hold the KV of the session before this one
                # for a moment (releases travel down the route after the answer came back), so
                # a full shard at the opening, before this attempt produced anything, is waited
                # out briefly on the same route; after that it is the client's overload.
                pause = next(busy_waits, None) if len(life.tokens) == produced else None
                if pause is None:
                    raise
                run.attempts.pop()
                await asyncio.sleep(pause)
            except MeshnetError as error:
                lost = None if failovers >= self._config.max_failovers else await self._lost_hops(error, route)
                if lost is None:
                    raise
                failovers += 1
                # A hop found dead stays excluded for the rest of the request, at the address it
                # was lost at (``route.lost_hops``: a relayed node comes back at another relay).
                lost_at.update((hop.node_id, hop.address) for hop in route.hops if hop.node_id in lost)
                await self._fail_over(run, error, lost_at)

    async def _kv_for(
        self, session: RouteSession, request: GenerationRequest, history: tuple[int, ...], *, resuming: bool
    ) -> tuple[KvPlan | None, SnapshotPlan | None]:
        """What the route restores: after a failover, the newest snapshot of the session every
        new hop holds (sparing the replay of the history before it); else the prompt KV it holds."""
        snapshot = await self._driver.resume(session, request, history) if resuming else None
        return (None if snapshot is not None else await self._driver.plan(session, request)), snapshot

    async def _fail_over(self, run: _Run, error: MeshnetError, lost_at: LostAt) -> None:
        run.route = await self._replace(run, error, lost_at)
        replay = f"{error.message}; replaying {len(run.life.tokens)} token(s) onto a new route"
        run.life.note(RouteHealth("failover", replay))

    def _offer_audit(self, run: _Run) -> None:
        # A request that failed over ran on a mix of routes; its replay would need the same mix,
        # so only requests served by one route are audited.
        if self.auditor is not None and len(run.attempts) == 1:
            self.auditor.submit(AuditCase(run.request_id, run.request, run.route, tuple(run.life.tokens)))

    def _report_timing(self, timing: RouteTiming | None) -> None:
        """Tell the tracker how fast the route served, in the background: the speeds it routes by
        are what requests measured, not what nodes claim (tracker.speeds)."""
        if timing is not None:
            task = asyncio.get_running_loop().create_task(self._send_timing(timing))
            self._timings.add(task)
            task.add_done_callback(self._timings.discard)

    async def _send_timing(self, timing: RouteTiming) -> None:
        try:
            await self.tracker.report_route_timing(timing, timeout_s=TIMING_REPORT_TIMEOUT_S)
        except MeshnetError as error:
            log.info("route timing not reported: %s", error.message)

    async def drain_reports(self, timeout_s: float | None = None) -> None:
        """Wait for work records (and route timings) still being reported, at most ``timeout_s``
        for the records; the timings, sent once with a short deadline of their own, end first.
        Turn warm-ups are not waited for: they are cancelled (nobody is waiting on them)."""
        await self._warmer.close()
        if self._timings:
            await asyncio.wait(set(self._timings), timeout=TIMING_REPORT_TIMEOUT_S)
        await self.reports.drain(timeout_s)

    async def route_context(self, model: str) -> int | None:
        """Tokens a session holds on the route the tracker gives ``model`` now; None: no route."""
        try:
            route = await self.tracker.choose_route(model)
        except NoRoute:
            return None
        self._chains.learn(model, route)
        return route.context_tokens

    def _check_context(self, route: Route, request: GenerationRequest) -> None:
        """Refuse a request that cannot fit the route, from the capability its hops carry (each
        hop's record as the node last registered it: a node restarted with another context is a
        new record, so no answer is remembered across routes)."""
        context = route.context_tokens
        prompt = len(request.prompt_tokens)
        if prompt + request.max_tokens > context:
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
        transport with INTERNAL), and the probe, not the relayed code, tells a lost hop. A stale
        route epoch is recovered the same way: the tracker moved the epoch on because a node
        left (a link down shows up here first), so the route is planned again and replayed.

        A route that answered no step within its measured budget (``StepTimedOut``) has a hung
        hop; a hop hung in its engine still answers its health check, and nothing outside it
        tells which hop that is. Then the whole route is avoided: replayed onto the same shards
        (the tracker keeps a session's route while its nodes live) it would meet the hung hop, and
        the lost route's session, again.
        """
        untyped = type(error) is MeshnetError
        if not (untyped or isinstance(error, Unavailable | CacheMiss | RouteStale)):
            return None
        dead = frozenset(await self._probe_dead(route))
        if isinstance(error, StepTimedOut) and not dead:
            return frozenset(hop.node_id for hop in route.hops)
        return None if untyped and not dead else dead

    async def _replace(self, run: _Run, error: MeshnetError, lost_at: LostAt) -> Route:
        hops = [hop.address for hop in run.route.hops]
        log.warning("route %s lost (%s); avoiding %s", hops, error.message, sorted(lost_at.values()))
        # A new route has a new ticket, of its newer epoch: the only way it may take the session
        # over on a shard still holding the lost route's (``Shard._supersede``).
        request = run.request

        async def tracker_route(exclude: frozenset[NodeId]) -> Route:
            return await self.tracker.choose_route(
                request.model,
                session_id=run.session_id,
                exclude=exclude,
                request_id=run.request_id,
                ticket_seconds=ticket_seconds(request.timeout_s),
                # A replacement whose head holds a prefix of the prompt replays less of it.
                prefix_chain=self._chains.chain(request),
            )

        async def ask(exclude: frozenset[NodeId]) -> Route:
            return await capable_route(tracker_route, needed_features(request), exclude)

        try:
            return await replacement_route(ask, lost_at)
        except (NoRoute, Unreachable) as no_route:
            # The client-visible fact is the lost worker (the status contract's ``worker_lost``);
            # no route, or no tracker to ask for one, is why it stays lost.
            raise Unavailable(f"{error.message}; no replacement route: {no_route.message}") from None

    async def _probe_dead(self, route: Route) -> set[NodeId]:
        """The hops that do not answer their health check SERVING (gone, or draining)."""
        answers = await asyncio.gather(
            *(is_serving(self._pool, hop.address, PROBE_TIMEOUT_S, hop.node_id) for hop in route.hops)
        )
        return {hop.node_id for hop, serving in zip(route.hops, answers, strict=True) if not serving}


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
