"""Verified work: re-run a sample of finished requests on other nodes and compare the tokens.

The gateway hands every completed request to ``Auditor.submit``; the sampled ones (a hash of
the request id, ``audit_verdicts.should_audit``) wait in a bounded queue and one background
task replays them, so users never wait for an audit and a burst only drops audits (counted),
never requests. Audits run in the gateway's capacity (``slot``) but are not billed: they are
the swarm checking itself.

A replay is a user's request as every node sees it (issue 29: nodes that knew replays computed
honestly on them only): a fresh request id and session id drawn as a user's are, the original's
prompt, sampling, token budget and deadline, the same frames (the head decodes on by itself),
a route the tracker chooses with the same call, after a random delay. Its tokens are compared
through a digest keyed for that one audit (``core.audit_evidence``). What no replay can hide is
that its prompt repeats one a node saw: a node may compute honestly on repeats; the verdicts
(``audit_verdicts``) assume nothing about which runs a faulty node lies on.

Routes are tried as ``audit_verdicts`` directs until the evidence isolates one node, by one
request's runs or across the window of requests no one request explains. That node is reported
to the tracker with the evidence (``Quarantine``), which re-checks it, takes the node out of
routes and, when it was on the original route, marks the request's work record ``unverified``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from meshnet.core.audit_evidence import MAX_AUDITS, AuditedRequest, AuditRun, QuarantineEvidence
from meshnet.core.errors import InvalidArgument, MeshnetError, NoRoute
from meshnet.core.events import TokenGenerated
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import NodeId, RequestId, new_request_id, new_session_id
from meshnet.core.recipe import FAMILY_PREFIX
from meshnet.core.tickets import ticket_seconds
from meshnet.core.tracking import QuarantineOrder, Route
from meshnet.membership.tracker_client import TrackerClient
from meshnet.route.audit_verdicts import (
    Verdict,
    blame_across,
    first_exclusion,
    judge,
    next_exclusions,
    output_digest,
    should_audit,
    unexplained,
)
from meshnet.route.driver import RouteDriver
from meshnet.route.route_run import RouteSession

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuditConfig:
    fraction: float = 0.05
    """Share of completed requests re-run on other nodes (0 disables; 1 audits every one)."""
    queue_limit: int = 64
    """Sampled requests waiting for their audit; beyond it new ones are dropped (and counted)."""
    max_trials: int = 8
    """Replays one audit may run while it narrows a disagreement down to one node."""
    max_delay_s: float = 1.0
    """Each replay starts after a random delay up to this (not in step with the original)."""
    record_retries: int = 20
    """Times the tracker is asked again to mark a record it has not received yet ..."""
    record_retry_s: float = 0.25
    """... this long apart (the gateway reports the record right after the request ends)."""

    def __post_init__(self) -> None:
        if not 0 <= self.fraction <= 1:
            raise InvalidArgument(f"audit fraction must be in [0, 1], got {self.fraction}")
        if self.queue_limit < 1 or self.max_trials < 1:
            raise InvalidArgument("audit queue limit and trials must be at least 1")
        if not 0 <= self.max_delay_s <= 3600:
            raise InvalidArgument(f"audit delay must be in [0, 3600] s, got {self.max_delay_s}")


@dataclass(frozen=True)
class AuditCase:
    """A completed request as it ran: what the audit replays and compares with."""

    request_id: RequestId
    request: GenerationRequest
    route: Route
    generated: tuple[int, ...]


@dataclass(frozen=True)
class AuditOutcome:
    request_id: RequestId
    verdict: Verdict
    runs: tuple[AuditRun, ...]
    """The original first, then every replay that finished."""
    culprit: NodeId | None = None
    """The node quarantined, by this request's runs or across requests."""
    record_marked: bool = False


class Slot(Protocol):
    """A place in the swarm's capacity, held while a replay runs."""

    def release(self) -> None: ...


class Auditor:
    """The gateway's audit queue and its one background task."""

    def __init__(
        self,
        tracker: TrackerClient,
        driver: RouteDriver,
        config: AuditConfig,
        *,
        on_outcome: Callable[[AuditOutcome], None] | None = None,
        slot: Callable[[], Awaitable[Slot]] | None = None,
    ) -> None:
        self._tracker = tracker
        self._driver = driver
        self._slot = slot
        """Where a replay takes its place in the swarm's capacity (the gateway's admission): a
        replay is a session on every shard of its route, and on nodes with few KV slots an
        uncounted one turns a user's request away as "shard full"."""
        self.config = config
        self._on_outcome = on_outcome
        self._queue: asyncio.Queue[AuditCase] = asyncio.Queue(config.queue_limit)
        self._task: asyncio.Task[None] | None = None
        self._rng = random.Random(secrets.randbits(64))
        self._unexplained: deque[AuditedRequest] = deque(maxlen=MAX_AUDITS)
        """Recent audits whose original no replay reproduced and no one request explains."""
        self.counts: Counter[str] = Counter()
        """sampled, dropped, clean, unchecked, caught, undecided, failed: for metrics and tests."""

    def submit(self, case: AuditCase) -> bool:
        """Queue ``case`` if it is sampled and there is room; never blocks."""
        if not case.generated or not should_audit(case.request_id, self.config.fraction):
            return False
        if case.route.fingerprint.startswith(FAMILY_PREFIX):
            return False  # a mixed-device route is not exact: a replay on another split may differ
        try:
            self._queue.put_nowait(case)
        except asyncio.QueueFull:
            self.counts["dropped"] += 1
            return False
        self.counts["sampled"] += 1
        return True

    def start(self) -> None:
        if self._task is None and self.config.fraction > 0:
            self._task = asyncio.create_task(self._run(), name="meshnet-audit")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            case = await self._queue.get()
            try:
                outcome = await self.audit(case)
            except MeshnetError as error:  # the tracker is away, say: this audit is lost, not the loop
                self.counts["failed"] += 1
                log.warning("audit of %s failed: %s", case.request_id, error.message)
                continue
            if self._on_outcome is not None:
                self._on_outcome(outcome)

    async def audit(self, case: AuditCase) -> AuditOutcome:
        """Replay ``case`` on other routes until the runs agree or the evidence isolates a node."""
        key = secrets.token_bytes(32)  # this audit's alone: digests mean nothing outside it
        original = AuditRun(tuple(hop.node_id for hop in case.route.hops), output_digest(key, case.generated))
        runs = [original]
        tried: list[frozenset[NodeId]] = []
        verdict = Verdict()
        pending = [first_exclusion(original.members)]
        # Routes already run or none to be had cost a tracker call each: bounded too.
        while pending and len(runs) <= self.config.max_trials and len(tried) < 4 * self.config.max_trials:
            exclusion = pending.pop(0)
            tried.append(exclusion)
            run = await self._trial(case, key, exclusion, runs)
            if run is not None:
                runs.append(run)
                verdict = judge(runs)
            if verdict.culprit is not None or (verdict.clean and _all_checked(runs)):
                break
            pending = list(next_exclusions(runs, verdict, tried))
        return await self._conclude(case, verdict, tuple(runs))

    async def _trial(
        self, case: AuditCase, key: bytes, exclusion: frozenset[NodeId], runs: list[AuditRun]
    ) -> AuditRun | None:
        # Not in step with the original (nor with the previous replay): a random start.
        await asyncio.sleep(self._rng.uniform(0, self.config.max_delay_s))
        # The slot first: the route is planned (and counted on its nodes) only once it can run.
        slot = None if self._slot is None else await self._slot()
        try:
            return await self._trial_in_slot(case, key, exclusion, runs)
        finally:
            if slot is not None:
                slot.release()

    async def _trial_in_slot(
        self, case: AuditCase, key: bytes, exclusion: frozenset[NodeId], runs: list[AuditRun]
    ) -> AuditRun | None:
        # Ids drawn as a user's are: nothing in a replay's frames names it an audit.
        request_id, session_id = new_request_id(), new_session_id()
        try:
            # By fingerprint: only a route of the very same recipe must reproduce the tokens.
            # With a session id: a replay is a session on the route, which the tracker counts.
            # A ticket for its request and as long as the original's (a user's ticket, to a node),
            # unbilled: only the tracker learns that no work record follows.
            route = await self._tracker.choose_route(
                case.route.fingerprint,
                session_id=session_id,
                exclude=exclusion,
                request_id=request_id,
                ticket_seconds=ticket_seconds(case.request.timeout_s),
                unbilled=True,
            )
        except NoRoute:
            return None
        nodes = tuple(hop.node_id for hop in route.hops)
        if any(frozenset(nodes) == run.members for run in runs):
            return None  # nothing new to learn from a route already run
        session = RouteSession(request_id, session_id, route.hops, route.fingerprint, route.epoch, route.ticket)
        tokens = await self._replay(case, session)
        return None if tokens is None else AuditRun(nodes, output_digest(key, tokens))

    async def _replay(self, case: AuditCase, session: RouteSession) -> tuple[int, ...] | None:
        """The tokens ``session``'s route produces for the case's request, as many as the original
        (a stop string may have ended it early); None when the replay could not finish."""
        wanted = len(case.generated)
        tokens: list[int] = []
        try:
            # Probed as any request is, but computed from the first token: what a node keeps is
            # what the audit checks, so a replay never reuses it (and no hop can tell: a user's
            # route reuses nothing whenever any one of its hops holds nothing).
            plan = await self._driver.plan(session, case.request)
            computed = None if plan is None else plan.reusing_nothing()
            async with contextlib.aclosing(self._driver.run(session, case.request, kv=computed)) as events:
                async for event in events:
                    if isinstance(event, TokenGenerated):
                        tokens.append(event.token_id)
                        if len(tokens) == wanted:
                            break
        except MeshnetError as error:  # a node lost mid-replay says nothing about its numbers
            log.info("audit replay of %s inconclusive: %s", case.request_id, error.message)
            return None
        return tuple(tokens)

    async def _conclude(self, case: AuditCase, verdict: Verdict, runs: tuple[AuditRun, ...]) -> AuditOutcome:
        audited = AuditedRequest(case.request_id, runs)
        evidence: QuarantineEvidence | None = None
        culprit = verdict.culprit
        if culprit is not None:
            evidence = QuarantineEvidence("one_request", (audited,))
        elif verdict.unreproducible:
            self._unexplained.append(audited)
            window = unexplained(self._unexplained)
            culprit = blame_across([judge(audit.runs).suspects for audit in window])
            if culprit is not None:
                evidence = QuarantineEvidence("across_requests", tuple(window))
        if culprit is None or evidence is None:
            kind = "unchecked" if len(runs) == 1 else verdict.kind
            self.counts[kind] += 1
            if kind == "undecided":
                log.warning("audit of %s undecided; suspects %s", case.request_id, sorted(verdict.suspects))
            return AuditOutcome(case.request_id, verdict, runs)
        # Explained now: what the window held against this node is spent.
        kept = [audit for audit in self._unexplained if culprit not in judge(audit.runs).suspects]
        self._unexplained = deque(kept, maxlen=MAX_AUDITS)
        on_original = culprit in runs[0].members
        reason = (
            f"audit of {case.request_id} ({evidence.rule}): {len(evidence.audits)} request(s), "
            f"{sum(len(a.runs) for a in evidence.audits)} run(s) isolate this node "
            f"({'on' if on_original else 'off'} the original route)"
        )
        order = QuarantineOrder(culprit, reason, case.request_id if on_original else None, evidence=evidence)
        marked = await self._quarantine(order)
        self.counts["caught"] += 1  # counted once the tracker has it: a caught audit is concluded
        log.warning("quarantined node %s: %s", culprit, reason)
        return AuditOutcome(case.request_id, verdict, runs, culprit, record_marked=marked)

    async def _quarantine(self, order: QuarantineOrder) -> bool:
        """Quarantine, retrying until the request's record has reached the tracker and is marked."""
        for _ in range(self.config.record_retries):
            answer = await self._tracker.quarantine(order)
            if order.request_id is None or answer.record_marked:
                return answer.record_marked
            await asyncio.sleep(self.config.record_retry_s)
        return False


def _all_checked(runs: list[AuditRun]) -> bool:
    """Every original node was left out of some replay (so checked against another node)."""
    original = runs[0].members
    covered: set[NodeId] = set()
    for run in runs[1:]:
        covered |= original - run.members
    return covered >= original
