"""Filing work records with the tracker: written ahead to the outbox, sent until acknowledged.

``WorkReporter`` owns every record between the end of a request and the tracker's
acknowledgement that it is stored. A record is persisted first, then one background task (the
flusher) sends the outbox's due records, oldest first, a batch at a time, and removes each one
the tracker acknowledges. Records are idempotent by request id, so a send that may have reached
the tracker is always safe to repeat.

What ends a record's stay, and what does not:

- acknowledged (stored, or stored before): removed;
- refused for what it is (``InvalidArgument``; ``FailedPrecondition``: another record under its
  request id): moved to the outbox's ``refused`` table, logged; never deleted;
- anything else (unreachable, deadline, the tracker's disk full or damaged, an unexpected error,
  a revoked certificate an operator will replace): kept, and sent again after a backoff that
  doubles up to a ceiling, each wait drawn between half and all of it (jitter), so gateways that
  lost the tracker together do not come back in step. There is no give-up time: a record leaves
  only through the tracker.

A full tracker disk once answered UNKNOWN, which this module took for a refusal and deleted the
record: 6 of 6 lost (issue 29, finding 8). The outbox has a soft limit (``outbox_limit``): past
it records are still written (the outbox is the safety net, and refusing users would not file
one record more) but ``/metrics`` says so (``outbox_over_limit``) and a warning is logged; memory
stays bounded whatever the depth, since the flusher reads one batch at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from meshnet.core.errors import FailedPrecondition, InvalidArgument, MeshnetError, TrackerBusy
from meshnet.core.tracking import WorkRecord
from meshnet.membership.backoff import BusyBackoff
from meshnet.route.outbox import OutboxStats, WorkOutbox

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReportPolicy:
    """How hard a record is pushed to the tracker."""

    timeout_s: float = 5.0
    """Budget of one attempt to file a work record."""
    backoff_s: tuple[float, float] = (0.25, 5.0)
    """First and longest wait between passes that left records unfiled; each wait is drawn
    between half and all of the current step (jitter)."""
    batch: int = 16
    """Records sent at once, oldest first (each its own call)."""
    drain_s: float = 2.0
    """At shutdown, how long due records may still try to reach the tracker; the rest wait in
    the outbox for the next start, so this only bounds how long stopping takes."""
    outbox_limit: int = 100_000
    """Due records past which ``/metrics`` shows ``outbox_over_limit`` and a warning is logged;
    records are still written beyond it."""


class WorkSink(Protocol):
    """The part of the tracker client a reporter needs."""

    async def report_work(self, record: WorkRecord, *, timeout_s: float | None = None) -> object: ...


def is_refusal(error: MeshnetError) -> bool:
    """Whether the tracker refused the record itself, so that sending it again cannot help."""
    return isinstance(error, (InvalidArgument, FailedPrecondition)) and not error.retryable


class WorkReporter:
    """Files records in the background; owned by one event loop."""

    def __init__(
        self,
        tracker: WorkSink,
        policy: ReportPolicy,
        outbox: WorkOutbox | None = None,
        *,
        jitter: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``jitter`` draws in [0, 1); ``clock`` is wall time (the records' age); ``sleep`` waits
        out a backoff. Tests inject them; the outbox is made in memory when none is given."""
        self._tracker = tracker
        self._policy = policy
        self._outbox = outbox if outbox is not None else WorkOutbox.in_memory(clock=clock)
        self._jitter = jitter
        self._clock = clock
        self._sleep = sleep
        self._writes: set[asyncio.Task[None]] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._stats = OutboxStats(0, 0, None, 0)
        self._busy_s = 0.0
        """The longest jittered retry hint of the last pass's shed records (0: none was shed)."""
        self.counts = {"acknowledged": 0, "retried": 0, "refused": 0}
        """Attempts by outcome since start: acknowledged, failed (kept, sent again), refused."""

    async def write_ahead(self, provisional: WorkRecord) -> None:
        """Persist a request's record before its work starts, so a crash leaves it (unverified)."""
        await asyncio.to_thread(self._outbox.put, provisional, provisional=True)

    def file(self, record: WorkRecord) -> None:
        """Persist ``record`` and have it sent; returns at once (it runs in a ``finally``)."""
        # Persisting must not be lost to the caller's cancellation, nor hold it up.
        task = asyncio.get_running_loop().create_task(self._persist(record))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    def replay(self) -> int:
        """Send what an earlier process left in the outbox (its unfinished requests' records
        as written ahead); returns how many records are due now."""
        orphans = self._outbox.release_orphans()
        self._stats = self._outbox.stats()
        if self._stats.due:
            log.info(
                "replaying %d work record(s) from %s (%d written ahead by a process that ended mid-request)",
                self._stats.due,
                self._outbox.path or "memory",
                orphans,
            )
        self._kick()
        return self._stats.due

    def figures(self) -> dict[str, float]:
        """The outbox's depth and age and the attempts' outcomes, for the gateway's ``/metrics``."""
        stats, limit = self._stats, self._policy.outbox_limit
        oldest = 0.0 if stats.oldest_due_at is None else max(self._clock() - stats.oldest_due_at, 0.0)
        return {
            "outbox_records": float(stats.due),
            "outbox_provisional_records": float(stats.provisional),
            "outbox_oldest_seconds": oldest,
            "outbox_refused_records": float(stats.refused),
            "outbox_limit": float(limit),
            "outbox_over_limit": float(stats.due > limit),
            **{f"work_reports_{outcome}_total": float(count) for outcome, count in self.counts.items()},
        }

    async def drain(self, timeout_s: float | None = None) -> None:
        """At shutdown: let due records reach the tracker for at most ``timeout_s``, then stop;
        whatever is left stays in the outbox for the next start."""
        budget = self._policy.drain_s if timeout_s is None else timeout_s
        deadline = asyncio.get_running_loop().time() + budget
        if self._writes:
            _, unfinished = await asyncio.wait(set(self._writes), timeout=budget)
            for task in unfinished:
                task.cancel()  # the write itself finishes (``_uninterrupted``)
            if unfinished:
                await asyncio.wait(unfinished)
        if self._flusher is None:
            return
        remaining = max(deadline - asyncio.get_running_loop().time(), 0.0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout=remaining)
        self._flusher.cancel()
        await asyncio.gather(self._flusher, return_exceptions=True)
        self._flusher = None
        left = (await asyncio.to_thread(self._outbox.stats)).due
        if left:
            where = "kept in the outbox for the next start" if self._outbox.path else "lost (no outbox file)"
            log.error("shutting down with %d work record(s) not acknowledged: %s", left, where)

    async def _persist(self, record: WorkRecord) -> None:
        await _uninterrupted(asyncio.to_thread(self._outbox.put, record))  # on disk before it is sent
        self._note(await asyncio.to_thread(self._outbox.stats))  # /metrics counts it while the flusher waits
        self._kick()

    def _kick(self) -> None:
        """Wake the flusher (starting it on first use): there is something to send."""
        self._idle.clear()
        self._wake.set()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_forever())

    async def _flush_forever(self) -> None:
        first, longest = self._policy.backoff_s
        step = first
        while True:
            self._wake.clear()
            try:
                done = await self._pass()
            except Exception:
                # The gateway's own disk failing (an outbox write), or a bug: nothing is lost by
                # waiting, everything by stopping.
                log.exception("filing work records failed; retrying")
                done = False
            if done is None:
                if not self._wake.is_set():  # a record filed during the pass is not sent yet
                    self._idle.set()
                await self._wake.wait()
                continue
            if done:
                step = first
                continue
            # A tracker that shed records said when to come back: never sooner than that.
            await self._sleep(max(step * (0.5 + self._jitter() / 2), self._busy_s))
            step = min(step * 2, longest)

    async def _pass(self) -> bool | None:
        """Send one batch of due records: None if there was none, else whether all were settled."""
        batch = await asyncio.to_thread(self._outbox.due, self._policy.batch)
        self._busy_s = 0.0
        outcomes = await asyncio.gather(*(self._attempt(record) for record in batch))
        self._note(await asyncio.to_thread(self._outbox.stats))
        return all(outcomes) if batch else None

    async def _attempt(self, record: WorkRecord) -> bool:
        """One try at filing ``record``: True once it left the outbox (acknowledged or refused)."""
        outbox = self._outbox
        try:
            await self._tracker.report_work(record, timeout_s=self._policy.timeout_s)
        except MeshnetError as error:
            if is_refusal(error):
                log.error(
                    "work record %s refused by the tracker [%s]: %s; kept in %s's refused table",
                    record.request_id,
                    error.code,
                    error.message,
                    outbox.path or "the in-memory outbox",
                )
                await _uninterrupted(asyncio.to_thread(outbox.refuse, record, error.code, error.message))
                self.counts["refused"] += 1
                return True
            if isinstance(error, TrackerBusy):
                self._busy_s = max(self._busy_s, BusyBackoff().wait_s(error.retry_after_s, self._jitter))
            log.warning("work record %s not filed yet [%s]: %s; retrying", record.request_id, error.code, error.message)
            await _uninterrupted(asyncio.to_thread(outbox.count_attempt, record.request_id))
            self.counts["retried"] += 1
            return False
        await _uninterrupted(asyncio.to_thread(outbox.remove, record.request_id))
        self.counts["acknowledged"] += 1
        return True

    def _note(self, stats: OutboxStats) -> None:
        limit = self._policy.outbox_limit
        if stats.due > limit >= self._stats.due:
            log.warning(
                "%d work records wait for the tracker, over the outbox limit of %d: they are kept, "
                "but the tracker has not stored any of them yet",
                stats.due,
                limit,
            )
        self._stats = stats


async def _uninterrupted(write: Coroutine[Any, Any, None]) -> None:
    """Await a write that must finish even if the caller is cancelled (it takes milliseconds):
    the outbox is closed after the drain, and a write cut off by that would lose the record."""
    task = asyncio.ensure_future(write)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise
