"""The secured tracker's work records: each report judged (``work_checks``) before it is stored,
the shards' counts taken in, and records of requests whose gateway died filed from those counts.

The servicer hands ``ReportWork``, ``ReportSessionTokens`` and its routes to one ``CheckedWork``;
the store is reached through the servicer's one store thread (``call``), like every other write.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from meshnet.core.ids import NodeId
from meshnet.core.tracking import Route, RouteQuery, SessionTokens, WorkAck, WorkRecord
from meshnet.tracker.dispute_log import DisputeWindow, close_due, note_dispute
from meshnet.tracker.store import TrackerStore
from meshnet.tracker.work_checks import WorkLedger

logger = logging.getLogger(__name__)

StoreCall = Callable[..., Awaitable[Any]]


class CheckedWork:
    """Judges and files work records against a ``WorkLedger``; owned by the tracker's event loop."""

    def __init__(
        self,
        ledger: WorkLedger,
        store: TrackerStore,
        call: StoreCall,
        known: Callable[[NodeId], bool],
        wall_clock: Callable[[], float],
    ) -> None:
        self.ledger = ledger
        self._store = store
        self._call = call
        self._known = known
        self._wall_clock = wall_clock
        self.share: Callable[[NodeId, tuple[SessionTokens, ...]], Awaitable[None]] | None = None
        """Hands the counts this tracker took to its other replicas (``tracker.etcd.membership``):
        a shard reports to its own replica, the route may have come from another."""
        self._disputes = DisputeWindow()
        """Disputes not yet summarized in the log (``dispute_log``)."""

    def routed(self, query: RouteQuery, route: Route, gateway: str | None) -> None:
        self.ledger.issue(query, route, gateway)

    async def report(self, record: WorkRecord, gateway: str | None) -> WorkAck:
        """Store ``record`` as judged; a retry of a stored record is a duplicate, as ever."""
        if self.ledger.settled_by_shards(record):
            logger.info("work record %s arrived after the tracker filed it from its shards' counts", record.request_id)
            return WorkAck(record.request_id, duplicate=True)
        # Known: live now, or registered with this tracker's database once (a node may leave, or
        # the tracker restart, between the work and its record).
        nodes = {share.node_id for share in record.attribution}
        seen = {node for node in nodes if self._known(node) or await self._call(self._store.node_seen, node)}
        verdict = await self.ledger.judge_waiting(record, gateway, seen.__contains__)
        if self.ledger.settled_by_shards(record):  # its grace ran out while it was being judged
            return WorkAck(record.request_id, duplicate=True)
        self.ledger.stored(verdict)  # settled before the write, so the grace's filing cannot race it
        stored = await self._call(
            self._store.record_judged_work, record, verdict.judged, verdict.reason, self._wall_clock()
        )
        if stored and verdict.status == "disputed":
            self._log_dispute(record, gateway, verdict.reason)
        return WorkAck(record.request_id, duplicate=not stored)

    def _log_dispute(self, record: WorkRecord, gateway: str | None, reason: str) -> None:
        """A warning for a reporter's first dispute in a window, a summary line for the rest
        (``dispute_log``): a gateway whose every record fails a check must not flood the log."""
        self._disputes, first = note_dispute(self._disputes, gateway, reason, self._wall_clock())
        if first:
            logger.warning("work record %s from %s disputed: %s", record.request_id, gateway, reason)
        else:
            logger.debug("work record %s from %s disputed: %s", record.request_id, gateway, reason)
        self.log_dispute_summaries()

    def log_dispute_summaries(self) -> None:
        """Log the disputes of the window, if it is due (``dispute_log``): after a dispute, and
        on every pass of ``file_from_shards_forever``, so the last window is not left unsaid."""
        self._disputes, summaries = close_due(self._disputes, self._wall_clock())
        for summary in summaries:
            logger.warning("%s", summary.line())

    async def counted(self, node_id: NodeId, sessions: tuple[SessionTokens, ...]) -> int:
        """Take a worker's counts (and share them with the other replicas, if any)."""
        taken = await self.take_counts(node_id, sessions)
        if self.share is not None:
            await self.share(node_id, sessions)
        return taken

    async def take_counts(self, node_id: NodeId, sessions: tuple[SessionTokens, ...]) -> int:
        """Take a shard's counts; a disputed record they now bear out gets its reported status."""
        taken, borne_out = self.ledger.count(node_id, sessions)
        for record in borne_out:
            await self._call(self._store.settle_work, record.request_id, record.status)
            logger.info("work record %s borne out by its shards' late counts: %s", record.request_id, record.status)
        return taken

    async def file_from_shards_forever(self, period_s: float) -> None:
        """File, from their shards' counts, the records of requests whose gateway never did."""
        while True:
            await asyncio.sleep(period_s)
            self.log_dispute_summaries()
            for record in self.ledger.due():
                try:
                    await self._call(self._store.record_work, record, self._wall_clock())
                except Exception:
                    # Disk trouble: the next report of this request (a gateway's successor) files it.
                    logger.exception("could not file work record %s from its shards' counts", record.request_id)
                    continue
                logger.warning(
                    "work record %s filed from its shards' counts (%d in, %d out): its gateway filed none",
                    record.request_id,
                    record.tokens_in,
                    record.tokens_out,
                )
