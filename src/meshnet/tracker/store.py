"""Durable tracker state behind a small protocol: the epoch, nodes seen, and work records.

``TrackerStore`` is what the tracker needs from a database; ``SqliteTrackerStore`` implements
it for one machine, and a server database can implement it later without touching the
tracker. Work records are what contributors get paid from, so they are written with
``synchronous=FULL`` in WAL mode (NORMAL can lose the last commits on power loss) and keyed by
``request_id``: the same record reported twice is stored once, which makes reporting safely
retryable across a tracker crash.

Live node state (heartbeats, load) is deliberately not stored: after a restart nodes
re-register within one heartbeat, and stale liveness would only route to the dead.

The file is checked before first use and refused when damaged, and SQLite's storage failures
leave as typed errors (``sqlite_guard``): a full disk is "retry", never "refused". The epoch is
kept a second time beside the file (``epoch_file``), so an emptied database does not restart it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from meshnet.core.audit_evidence import QuarantineEntry, QuarantineEvidence, evidence_from_json, evidence_to_json
from meshnet.core.errors import FailedPrecondition
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeRecord
from meshnet.core.tracking import NodeWork, WorkRecord, WorkStatus
from meshnet.tracker.epoch_file import EpochFile, epoch_file_beside
from meshnet.tracker.sqlite_guard import check_integrity, translated
from meshnet.tracker.store_schema import create_schema

logger = logging.getLogger(__name__)


class TrackerStore(Protocol):
    """What the tracker persists. Calls block; the server runs them off its event loop."""

    def load_epoch(self) -> int: ...

    def save_epoch(self, epoch: int) -> None:
        """Record ``epoch`` unless a larger one is stored already: the epoch never goes down."""
        ...

    def record_node(self, node_id: NodeId, record: NodeRecord, seen_at: float) -> None: ...

    def record_work(self, record: WorkRecord, recorded_at: float) -> bool:
        """Store ``record`` durably; False if this exact record was stored before.

        Raises ``FailedPrecondition`` if its request id was stored with different content.
        """
        ...

    def record_judged_work(self, reported: WorkRecord, judged: WorkRecord, reason: str, recorded_at: float) -> bool:
        """Store ``judged``, the tracker's verdict on ``reported`` (``tracker.work_checks``), with
        ``reason`` when it is not as reported; idempotent by ``reported``'s content, as ``record_work``."""

    def settle_work(self, request_id: RequestId, status: WorkStatus) -> None:
        """A disputed record borne out after all: ``status`` now, its dispute forgotten."""

    def work_dispute(self, request_id: RequestId) -> str | None:
        """Why the record is not stored as reported; None: it is."""

    def node_seen(self, node_id: NodeId) -> bool:
        """Whether ``node_id`` ever registered with this tracker (its database)."""

    def get_work(self, request_id: RequestId) -> WorkRecord | None: ...

    def list_work(self) -> list[WorkRecord]:
        """Every stored record, in the order they were stored."""
        ...

    def quarantine_node(
        self,
        node_id: NodeId,
        reason: str,
        request_id: RequestId | None,
        at: float,
        evidence: QuarantineEvidence | None = None,
    ) -> bool:
        """Remember ``node_id`` as quarantined (with the audit's ``evidence``) and mark
        ``request_id``'s record unverified.

        Returns whether that record existed (and is now unverified).
        """
        ...

    def clear_quarantine(self, node_id: NodeId) -> None: ...

    def quarantined_nodes(self) -> tuple[NodeId, ...]: ...

    def quarantine_entries(self) -> tuple[QuarantineEntry, ...]:
        """Every quarantined node with why, since when and the evidence, oldest first."""
        ...

    def close(self) -> None: ...


def work_fingerprint(record: WorkRecord) -> str:
    """sha256 of a canonical encoding of every field: equal records, equal digests."""
    canonical = json.dumps(asdict(record), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class SqliteTrackerStore:
    """``TrackerStore`` in one SQLite file. Safe to call from any one thread at a time.

    Opening refuses a damaged file (``StorageDamaged``); every call raises ``StorageUnavailable``
    when the disk fails it (full, I/O error, locked), having stored nothing.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._epoch_file = EpochFile(epoch_file_beside(path))
        self._lock = threading.Lock()
        with translated(path):
            # isolation_level=None: we issue BEGIN ourselves, so each write is exactly one transaction.
            self._connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            try:
                fresh = self._open()
            except BaseException:
                self._connection.close()
                raise
        self._file_epoch = self._epoch_file.load()
        if fresh and self._file_epoch > 0:
            logger.warning(
                "the tracker database %s is new or empty, but %s says the epoch was %d: the epoch "
                "continues from there; work records and quarantines stored before are not in this file",
                path,
                self._epoch_file.path,
                self._file_epoch,
            )

    def _open(self) -> bool:
        """Check, configure and bring the file to this schema; True if it held no tables yet."""
        connection = self._connection
        check_integrity(connection, self.path)  # before anything reads or writes it
        fresh = connection.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
        connection.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit is on disk before we acknowledge it (reliability.md, K1).
        connection.execute("PRAGMA synchronous=FULL")
        connection.execute("PRAGMA foreign_keys=ON")
        create_schema(connection)
        return bool(fresh)

    @contextlib.contextmanager
    def _using(self) -> Iterator[sqlite3.Connection]:
        """The connection, held alone, with SQLite's storage failures typed."""
        with self._lock, translated(self.path):
            yield self._connection

    def load_epoch(self) -> int:
        """The larger of the database's epoch and the epoch file's."""
        with self._using() as connection:
            row = connection.execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone()
        return max(int(row[0]), self._file_epoch)

    def save_epoch(self, epoch: int) -> None:
        with self._using() as connection:
            connection.execute("UPDATE meta SET value = max(value, ?) WHERE key = 'epoch'", (epoch,))
            if epoch > self._file_epoch:
                self._epoch_file.save(epoch)
                self._file_epoch = epoch

    def record_node(self, node_id: NodeId, record: NodeRecord, seen_at: float) -> None:
        with self._using() as connection:
            connection.execute(
                """INSERT INTO nodes(node_id, address, model, fingerprint, layer_start, layer_stop,
                                     registration_json, first_seen, last_registered)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT(node_id) DO UPDATE SET
                     address = excluded.address, model = excluded.model,
                     fingerprint = excluded.fingerprint,
                     layer_start = excluded.layer_start, layer_stop = excluded.layer_stop,
                     registration_json = excluded.registration_json,
                     last_registered = excluded.last_registered""",
                (
                    node_id,
                    record.address,
                    record.model,
                    record.fingerprint,
                    record.layers.start,
                    record.layers.stop,
                    json.dumps(asdict(record), sort_keys=True),
                    seen_at,
                    seen_at,
                ),
            )

    def record_work(self, record: WorkRecord, recorded_at: float) -> bool:
        return self.record_judged_work(record, record, "", recorded_at)

    def record_judged_work(self, reported: WorkRecord, judged: WorkRecord, reason: str, recorded_at: float) -> bool:
        """Store ``judged`` for ``reported`` (with the dispute's ``reason``, if any), once: a
        resend of the same report is a duplicate (False), another under its id is refused."""
        digest = work_fingerprint(reported)
        with self._using() as connection:
            # IMMEDIATE takes the write lock now, so the duplicate check and the insert are atomic
            # even against another process writing the same file.
            connection.execute("BEGIN IMMEDIATE")
            try:
                row = connection.execute(
                    "SELECT content_sha256 FROM work_records WHERE request_id = ?", (reported.request_id,)
                ).fetchone()
                if row is not None:
                    connection.execute("ROLLBACK")
                    if row[0] != digest:
                        raise FailedPrecondition(
                            f"work record {reported.request_id} was stored with other content: "
                            "a request is reported once (a new request needs a new id)"
                        )
                    return False
                self._insert_work(judged, recorded_at, digest)
                if reason:
                    connection.execute(
                        "INSERT INTO work_disputes(request_id, reason) VALUES (?, ?)", (judged.request_id, reason)
                    )
                connection.execute("COMMIT")
            except BaseException:
                # A failed disk may fail the rollback too; SQLite rolls back on its own then.
                with contextlib.suppress(sqlite3.Error):
                    if connection.in_transaction:
                        connection.execute("ROLLBACK")
                raise
        return True

    def settle_work(self, request_id: RequestId, status: WorkStatus) -> None:
        with self._using() as held, held as connection:
            connection.execute("UPDATE work_records SET status = ? WHERE request_id = ?", (status, request_id))
            connection.execute("DELETE FROM work_disputes WHERE request_id = ?", (request_id,))

    def work_dispute(self, request_id: RequestId) -> str | None:
        with self._using() as connection:
            row = connection.execute("SELECT reason FROM work_disputes WHERE request_id = ?", (request_id,)).fetchone()
        return None if row is None else str(row[0])

    def node_seen(self, node_id: NodeId) -> bool:
        with self._using() as connection:
            row = connection.execute("SELECT 1 FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
        return row is not None

    def get_work(self, request_id: RequestId) -> WorkRecord | None:
        with self._using() as connection:
            row = connection.execute(
                f"SELECT {_WORK_COLUMNS} FROM work_records WHERE request_id = ?", (request_id,)
            ).fetchone()
            return None if row is None else self._work_from_row(row)

    def list_work(self) -> list[WorkRecord]:
        with self._using() as connection:
            rows = connection.execute(f"SELECT {_WORK_COLUMNS} FROM work_records ORDER BY rowid").fetchall()
            return [self._work_from_row(row) for row in rows]

    def quarantine_node(
        self,
        node_id: NodeId,
        reason: str,
        request_id: RequestId | None,
        at: float,
        evidence: QuarantineEvidence | None = None,
    ) -> bool:
        with self._using() as held, held as connection:
            connection.execute("DELETE FROM quarantine_evidence WHERE node_id = ?", (node_id,))
            connection.execute(
                "INSERT OR REPLACE INTO quarantined_nodes (node_id, reason, request_id, since) VALUES (?, ?, ?, ?)",
                (node_id, reason, request_id, at),
            )
            if evidence is not None:
                connection.execute(
                    "INSERT INTO quarantine_evidence (node_id, evidence_json) VALUES (?, ?)",
                    (node_id, evidence_to_json(evidence)),
                )
            if request_id is None:
                return False
            # Only the status changes: content_sha256 stays, so a retried report of the original
            # record is still recognised as the duplicate it is.
            marked = connection.execute(
                "UPDATE work_records SET status = 'unverified' WHERE request_id = ?", (request_id,)
            ).rowcount
            return bool(marked)

    def clear_quarantine(self, node_id: NodeId) -> None:
        with self._using() as held, held as connection:
            connection.execute("DELETE FROM quarantine_evidence WHERE node_id = ?", (node_id,))
            connection.execute("DELETE FROM quarantined_nodes WHERE node_id = ?", (node_id,))

    def quarantined_nodes(self) -> tuple[NodeId, ...]:
        with self._using() as connection:
            rows = connection.execute("SELECT node_id FROM quarantined_nodes ORDER BY since").fetchall()
        return tuple(NodeId(row[0]) for row in rows)

    def quarantine_entries(self) -> tuple[QuarantineEntry, ...]:
        with self._lock:
            rows = self._connection.execute(
                """SELECT q.node_id, q.reason, q.request_id, q.since, e.evidence_json
                   FROM quarantined_nodes q LEFT JOIN quarantine_evidence e ON e.node_id = q.node_id
                   ORDER BY q.since"""
            ).fetchall()
        return tuple(
            QuarantineEntry(
                NodeId(node_id),
                reason,
                None if request_id is None else RequestId(request_id),
                float(since),
                None if evidence is None else evidence_from_json(evidence),
            )
            for node_id, reason, request_id, since, evidence in rows
        )

    def close(self) -> None:
        with self._lock:
            self._connection.close()

    def _insert_work(self, record: WorkRecord, recorded_at: float, digest: str) -> None:
        self._connection.execute(
            f"INSERT INTO work_records({_WORK_COLUMNS}, recorded_at, content_sha256) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                record.request_id,
                record.session_id,
                record.model,
                record.status,
                record.tokens_in,
                record.tokens_out,
                record.billing_units,
                record.started_at,
                record.finished_at,
                recorded_at,
                digest,
            ),
        )
        self._connection.executemany(
            "INSERT INTO work_shares(request_id, position, node_id, layer_start, layer_stop, "
            "tokens) VALUES (?, ?, ?, ?, ?, ?)",
            [
                (
                    record.request_id,
                    position,
                    share.node_id,
                    share.layers.start,
                    share.layers.stop,
                    share.tokens,
                )
                for position, share in enumerate(record.attribution)
            ],
        )

    def _work_from_row(self, row: tuple[Any, ...]) -> WorkRecord:
        request_id, session_id, model, status, tokens_in, tokens_out, billing, started, finished = row
        shares = self._connection.execute(
            "SELECT node_id, layer_start, layer_stop, tokens FROM work_shares WHERE request_id = ? ORDER BY position",
            (request_id,),
        ).fetchall()
        return WorkRecord(
            request_id=RequestId(request_id),
            session_id=SessionId(session_id) if session_id is not None else None,
            model=model,
            status=status,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            attribution=tuple(
                NodeWork(NodeId(node), LayerRange(start, stop), tokens) for node, start, stop, tokens in shares
            ),
            billing_units=billing,
            started_at=started,
            finished_at=finished,
        )


_WORK_COLUMNS = "request_id, session_id, model, status, tokens_in, tokens_out, billing_units, started_at, finished_at"
