"""Verified work: re-run a sample of finished requests on other nodes and compare the tokens.

The gateway hands every completed request to ``Auditor.submit``; the sampled ones (a hash of
the request id, ``audit_verdicts.should_audit``) wait in a bounded queue and one background
task replays them, so users never wait for an audit and a burst only drops audits (counted),
never requests. A replay asks the tracker for a route avoiding some nodes and feeds it the
prompt and the generated tokens exactly as the original decode steps did (the driver's
failover replay): each shard computes what the original computed, the tail re-samples every
token, and the first token that differs ends the replay as a disagreement.

Routes are tried as ``audit_verdicts`` directs until one node explains every disagreement;
that node is reported to the tracker (``Quarantine``), which takes it out of routes and, when it
was on the original route, marks the request's work record ``unverified``. Audit replays are
not billed: they are the swarm checking itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Protocol

from meshnet.core.errors import IntegrityError, InvalidArgument, MeshnetError, NoRoute
from meshnet.core.events import TokenGenerated
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import NodeId, RequestId, SessionId, new_session_id
from meshnet.core.recipe import FAMILY_PREFIX
from meshnet.core.tracking import QuarantineOrder, Route
from meshnet.membership.tracker_client import TrackerClient
from meshnet.route.audit_verdicts import (
    Trial,
    Verdict,
    first_exclusion,
    judge,
    next_exclusions,
    should_audit,
)
from meshnet.route.driver import RouteDriver, RouteSession

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuditConfig:
    fraction: float = 0.05
    """Share of completed requests re-run on other nodes (0 disables; 1 audits every one)."""
    queue_limit: int = 64
    """Sampled requests waiting for their audit; beyond it new ones are dropped (and counted)."""
    max_trials: int = 8
    """Replays one audit may run while it narrows a disagreement down to one node."""
    record_retries: int = 20
    """Times the tracker is asked again to mark a record it has not received yet ..."""
    record_retry_s: float = 0.25
    """... this long apart (the gateway reports the record right after the request ends)."""

    def __post_init__(self) -> None:
        if not 0 <= self.fraction <= 1:
            raise InvalidArgument(f"audit fraction must be in [0, 1], got {self.fraction}")
        if self.queue_limit < 1 or self.max_trials < 1:
            raise InvalidArgument("audit queue limit and trials must be at least 1")


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
    trials: tuple[Trial, ...]
    record_marked: bool = False


class Slot(Protocol):
    """A place in the swarm's capacity, held while a replay runs."""

    def release(self) -> None: ...


def _nodes(route: Route) -> frozenset[NodeId]:
    return frozenset(hop.node_id for hop in route.hops)


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
        """Replay ``case`` on other routes until the tokens agree or one node is to blame."""
        original = _nodes(case.route)
        trials: list[Trial] = []
        tried: list[frozenset[NodeId]] = []
        verdict = Verdict()
        pending = [first_exclusion(original)]
        while pending and len(trials) < self.config.max_trials:
            exclusion = pending.pop(0)
            tried.append(exclusion)
            trial = await self._trial(case, exclusion, original, trials)
            if trial is not None:
                trials.append(trial)
                verdict = judge(original, trials)
            if verdict.culprit is not None or (verdict.clean and _all_checked(original, trials)):
                break
            pending = list(next_exclusions(original, verdict, tried))
        return await self._conclude(case, original, verdict, tuple(trials))

    async def _trial(
        self, case: AuditCase, exclusion: frozenset[NodeId], original: frozenset[NodeId], trials: list[Trial]
    ) -> Trial | None:
        # The slot first: the route is planned (and counted on its nodes) only once it can run.
        slot = None if self._slot is None else await self._slot()
        try:
            return await self._trial_in_slot(case, exclusion, original, trials)
        finally:
            if slot is not None:
                slot.release()

    async def _trial_in_slot(
        self, case: AuditCase, exclusion: frozenset[NodeId], original: frozenset[NodeId], trials: list[Trial]
    ) -> Trial | None:
        try:
            # By fingerprint: only a route of the very same recipe must reproduce the tokens.
            # With a session id: a replay is a session on the route, which the tracker counts.
            session_id = new_session_id()
            route = await self._tracker.choose_route(case.route.fingerprint, session_id=session_id, exclude=exclusion)
        except NoRoute:
            return None
        nodes = _nodes(route)
        if nodes == original or any(nodes == trial.nodes for trial in trials):
            return None  # nothing new to learn from a route already run
        agreed = await self._replay(case, route, session_id)
        return None if agreed is None else Trial(nodes, agreed)

    async def _replay(self, case: AuditCase, route: Route, session_id: SessionId) -> bool | None:
        """Whether ``route`` reproduces the case's tokens; None when the replay could not finish."""
        generated = case.generated
        request = replace(case.request, max_tokens=len(generated))
        audit_id = RequestId(f"{case.request_id}-audit")
        session = RouteSession(audit_id, session_id, route.hops, route.fingerprint, route.epoch)
        last: int | None = None
        try:
            async for event in self._driver.run(session, request, history=generated[:-1]):
                if isinstance(event, TokenGenerated):
                    last = event.token_id
        except IntegrityError as divergence:
            log.info("audit of %s: route %s disagrees: %s", case.request_id, sorted(_nodes(route)), divergence)
            return False
        except MeshnetError as error:  # a node lost mid-replay says nothing about its numbers
            log.info("audit replay of %s inconclusive: %s", case.request_id, error.message)
            return None
        return last == generated[-1]

    async def _conclude(
        self, case: AuditCase, original: frozenset[NodeId], verdict: Verdict, trials: tuple[Trial, ...]
    ) -> AuditOutcome:
        if verdict.culprit is None:
            # No replay at all: the swarm has no other node for any of the route's layers.
            kind = ("clean" if trials else "unchecked") if verdict.clean else "undecided"
            self.counts[kind] += 1
            if not verdict.clean:
                log.warning("audit of %s: outputs disagree; suspects %s", case.request_id, sorted(verdict.suspects))
            return AuditOutcome(case.request_id, verdict, trials)
        self.counts["caught"] += 1
        on_original = verdict.culprit in original
        reason = (
            f"audit of {case.request_id}: its tokens disagree with {len(trials)} replay(s) on other nodes "
            f"for the same layers ({'on' if on_original else 'off'} the original route)"
        )
        order = QuarantineOrder(verdict.culprit, reason, case.request_id if on_original else None)
        marked = await self._quarantine(order)
        log.warning("quarantined node %s: %s", verdict.culprit, reason)
        return AuditOutcome(case.request_id, verdict, trials, record_marked=marked)

    async def _quarantine(self, order: QuarantineOrder) -> bool:
        """Quarantine, retrying until the request's record has reached the tracker and is marked."""
        for _ in range(self.config.record_retries):
            answer = await self._tracker.quarantine(order)
            if order.request_id is None or answer.record_marked:
                return answer.record_marked
            await asyncio.sleep(self.config.record_retry_s)
        return False


def _all_checked(original: frozenset[NodeId], trials: list[Trial]) -> bool:
    """Every original node was left out of some agreeing replay (so checked against another)."""
    covered: set[NodeId] = set()
    for trial in trials:
        if trial.agreed:
            covered |= original - trial.nodes
    return covered >= original
