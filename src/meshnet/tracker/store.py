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

from meshnet.core.errors import FailedPrecondition
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeRecord
from meshnet.core.tracking import NodeWork, WorkRecord
from meshnet.tracker.epoch_file import EpochFile, epoch_file_beside
from meshnet.tracker.sqlite_guard import check_integrity, translated

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 2
"""2: work records may be ``unverified`` (DGR-013); a version-1 file is migrated on open."""


def _work_records_table(name: str) -> str:
    return f"""
CREATE TABLE IF NOT EXISTS {name} (
    request_id TEXT PRIMARY KEY,
    session_id TEXT,
    model TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('completed', 'cancelled', 'failed', 'unverified')),
    tokens_in INTEGER NOT NULL,
    tokens_out INTEGER NOT NULL,
    billing_units REAL NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL NOT NULL,
    recorded_at REAL NOT NULL,
    content_sha256 TEXT NOT NULL
);
"""


_SCHEMA = (
    _work_records_table("work_records")
    + """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS nodes (
    node_id TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    model TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    layer_start INTEGER NOT NULL,
    layer_stop INTEGER NOT NULL,
    registration_json TEXT NOT NULL,
    first_seen REAL NOT NULL,
    last_registered REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS work_shares (
    request_id TEXT NOT NULL REFERENCES work_records(request_id),
    position INTEGER NOT NULL,
    node_id TEXT NOT NULL,
    layer_start INTEGER NOT NULL,
    layer_stop INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    PRIMARY KEY (request_id, position)
);
CREATE INDEX IF NOT EXISTS work_shares_by_node ON work_shares(node_id);
CREATE TABLE IF NOT EXISTS quarantined_nodes (
    node_id TEXT PRIMARY KEY,
    reason TEXT NOT NULL,
    request_id TEXT,
    since REAL NOT NULL
);
"""
)


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

    def get_work(self, request_id: RequestId) -> WorkRecord | None: ...

    def list_work(self) -> list[WorkRecord]:
        """Every stored record, in the order they were stored."""
        ...

    def quarantine_node(self, node_id: NodeId, reason: str, request_id: RequestId | None, at: float) -> bool:
        """Remember ``node_id`` as quarantined and mark ``request_id``'s record unverified.

        Returns whether that record existed (and is now unverified).
        """
        ...

    def clear_quarantine(self, node_id: NodeId) -> None: ...

    def quarantined_nodes(self) -> tuple[NodeId, ...]: ...

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
        connection.executescript(_SCHEMA)
        connection.execute(
            "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?), ('epoch', 0)",
            (SCHEMA_VERSION,),
        )
        self._migrate()
        return bool(fresh)

    @contextlib.contextmanager
    def _using(self) -> Iterator[sqlite3.Connection]:
        """The connection, held alone, with SQLite's storage failures typed."""
        with self._lock, translated(self.path):
            yield self._connection

    def _migrate(self) -> None:
        """Bring a version-1 file to this schema: SQLite cannot alter a CHECK, so the table of
        work records is rebuilt (the documented 12-step way), keeping rows and their order."""
        connection = self._connection
        (version,) = connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if version >= SCHEMA_VERSION:
            return
        connection.execute("PRAGMA foreign_keys=OFF")  # only takes effect outside a transaction
        connection.execute("BEGIN IMMEDIATE")
        try:
            connection.execute(_work_records_table("work_records_next"))
            connection.execute("INSERT INTO work_records_next SELECT * FROM work_records ORDER BY rowid")
            connection.execute("DROP TABLE work_records")
            connection.execute("ALTER TABLE work_records_next RENAME TO work_records")
            connection.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION,))
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        finally:
            connection.execute("PRAGMA foreign_keys=ON")

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
        digest = work_fingerprint(record)
        with self._using() as connection:
            # IMMEDIATE takes the write lock now, so the duplicate check and the insert are atomic
            # even against another process writing the same file.
            connection.execute("BEGIN IMMEDIATE")
            try:
                row = connection.execute(
                    "SELECT content_sha256 FROM work_records WHERE request_id = ?",
                    (record.request_id,),
                ).fetchone()
                if row is not None:
                    connection.execute("ROLLBACK")
                    if row[0] != digest:
                        raise FailedPrecondition(
                            f"work record {record.request_id} was stored with other content: "
                            "a request is reported once (a new request needs a new id)"
                        )
                    return False
                self._insert_work(record, recorded_at, digest)
                connection.execute("COMMIT")
            except BaseException:
                # A failed disk may fail the rollback too; SQLite rolls back on its own then.
                with contextlib.suppress(sqlite3.Error):
                    if connection.in_transaction:
                        connection.execute("ROLLBACK")
                raise
        return True

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

    def quarantine_node(self, node_id: NodeId, reason: str, request_id: RequestId | None, at: float) -> bool:
        with self._using() as held, held as connection:
            connection.execute(
                "INSERT OR REPLACE INTO quarantined_nodes (node_id, reason, request_id, since) VALUES (?, ?, ?, ?)",
                (node_id, reason, request_id, at),
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
            connection.execute("DELETE FROM quarantined_nodes WHERE node_id = ?", (node_id,))

    def quarantined_nodes(self) -> tuple[NodeId, ...]:
        with self._using() as connection:
            rows = connection.execute("SELECT node_id FROM quarantined_nodes ORDER BY since").fetchall()
        return tuple(NodeId(row[0]) for row in rows)

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
