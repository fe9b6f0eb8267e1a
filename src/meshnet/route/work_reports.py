"""Filing work records with the tracker: written ahead to the outbox, retried, replayed at start.

``WorkReporter`` owns every record between the end of a request and the tracker's
acknowledgement. A record is persisted first (when an outbox is given), then sent with backoff
while the tracker is unreachable, and removed once acknowledged; at start-up ``replay`` sends
whatever an earlier process left. Records are idempotent by request id, so a send that may
have reached the tracker is always safe to repeat.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from meshnet.core.errors import DeadlineExceeded, MeshnetError, Unavailable
from meshnet.core.tracking import WorkRecord
from meshnet.route.outbox import WorkOutbox

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReportPolicy:
    """How hard a record is pushed to the tracker."""

    timeout_s: float = 5.0
    """Budget of one attempt to file a work record."""
    retry_for_s: float = 600.0
    """How long a record is retried while the tracker is unreachable (it restarts, or is moved)
    before this process gives up on it. With an outbox it is not lost then: the next start-up
    sends it again."""
    backoff_s: tuple[float, float] = (0.25, 5.0)
    """First and longest wait between attempts to file a record."""
    drain_s: float = 2.0
    """At shutdown, how long records still queued may try to reach the tracker; with an outbox
    the rest wait on disk for the next start, so this only bounds how long stopping takes."""


class WorkSink(Protocol):
    """The part of the tracker client a reporter needs."""

    async def report_work(self, record: WorkRecord, *, timeout_s: float | None = None) -> object: ...


class WorkReporter:
    """Files records in the background; owned by one event loop."""

    def __init__(self, tracker: WorkSink, policy: ReportPolicy, outbox: WorkOutbox | None = None) -> None:
        self._tracker = tracker
        self._policy = policy
        self._outbox = outbox
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def pending(self) -> int:
        """Records being filed by this process now."""
        return len(self._tasks)

    async def write_ahead(self, provisional: WorkRecord) -> None:
        """Persist a request's record before its work starts, so a crash leaves it (unverified)."""
        if self._outbox is not None:
            await asyncio.to_thread(self._outbox.put, provisional)

    def file(self, record: WorkRecord) -> None:
        """Persist and send ``record`` in the background; returns at once (it runs in a ``finally``)."""
        self._spawn(record, persist=True)

    def replay(self) -> int:
        """Send every record an earlier process left in the outbox; returns how many."""
        if self._outbox is None:
            return 0
        left = self._outbox.pending()
        for record in left:
            self._spawn(record, persist=False)
        if left:
            log.info("replaying %d work record(s) from %s", len(left), self._outbox.path)
        return len(left)

    async def drain(self, timeout_s: float | None = None) -> None:
        """Wait for records still being filed (at shutdown), at most ``timeout_s``."""
        if not self._tasks:
            return
        budget = self._policy.drain_s if timeout_s is None else timeout_s
        _, unfinished = await asyncio.wait(set(self._tasks), timeout=budget)
        for task in unfinished:
            task.cancel()
        if unfinished:
            await asyncio.wait(unfinished)
            where = "kept in the outbox for the next start" if self._outbox is not None else "lost"
            log.error("shutting down with %d work record(s) not acknowledged: %s", len(unfinished), where)

    def _spawn(self, record: WorkRecord, *, persist: bool) -> None:
        # Reporting must not be lost to the caller's cancellation, nor hold it up.
        task = asyncio.get_running_loop().create_task(self._deliver(record, persist=persist))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, record: WorkRecord, *, persist: bool) -> None:
        outbox = self._outbox
        if persist and outbox is not None:
            await _uninterrupted(asyncio.to_thread(outbox.put, record))  # on disk before it is sent
        if await self._send(record) and outbox is not None:
            await _uninterrupted(asyncio.to_thread(outbox.remove, record.request_id))

    async def _send(self, record: WorkRecord) -> bool:
        """Send until acknowledged (True), refused (True: retrying cannot help) or out of time."""
        deadline = time.monotonic() + self._policy.retry_for_s
        delay, longest = self._policy.backoff_s
        while True:
            try:
                await self._tracker.report_work(record, timeout_s=self._policy.timeout_s)
                return True
            except (Unavailable, DeadlineExceeded) as error:
                if time.monotonic() + delay > deadline:
                    log.error(
                        "work record %s not acknowledged: the tracker was unreachable for %.0f s (%s)",
                        record.request_id,
                        self._policy.retry_for_s,
                        error.message,
                    )
                    return False
                log.warning(
                    "work record %s not filed yet (%s); retry in %.2f s", record.request_id, error.message, delay
                )
            except MeshnetError as error:
                log.error("work record %s refused by the tracker: %s", record.request_id, error.message)
                return True
            await asyncio.sleep(delay)
            delay = min(delay * 2, longest)


async def _uninterrupted(write: Coroutine[Any, Any, None]) -> None:
    """Await a write that must finish even if the caller is cancelled (it takes milliseconds):
    the outbox is closed after the drain, and a write cut off by that would lose the record."""
    task = asyncio.ensure_future(write)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise
