"""A durable outbox of work records the tracker has not acknowledged yet, in one SQLite file.

Records are what contributors are paid from, and a gateway holds them only until the tracker
acknowledges them; without a disk copy a crash (or SIGKILL) of the gateway loses every record
still queued for an unreachable tracker. So a record is written here *before* it is sent, kept
until the tracker acknowledges it as stored, and whatever is left is sent again at the next
start-up. Sending twice is harmless: the tracker stores a record once per request id.

Each request is written twice: when its route is accepted, as a *provisional* ``unverified``
record (what the gateway knows then), and once it ends, replaced by its real outcome, now *due*
(to be sent). A gateway that dies mid-request thus still leaves a record, honestly labelled as
one nobody could vouch for (DGR-013): the next process, holding the outbox alone, finds it
provisional and sends it as it is (``release_orphans``).

A record the tracker refuses for what it is (malformed, or another record under its request
id) is not deleted: it moves to the ``refused`` table with the tracker's reason, for an
operator to read (``refused_records``). Nothing here is ever dropped silently.

Like the tracker's store: WAL with ``synchronous=FULL`` (a write is on disk before the record is
sent), and an exclusive lock on the directory, because a second gateway on the same file would
replay this one's in-flight requests as unverified. ``WorkOutbox.in_memory()`` is the same
outbox without a file, for a reporter given none (it keeps records only while the process lives).
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from meshnet.core.errors import FailedPrecondition
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.tracking import NodeWork, WorkRecord

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    request_id TEXT PRIMARY KEY,
    record_json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS refused (
    request_id TEXT PRIMARY KEY,
    record_json TEXT NOT NULL,
    code TEXT NOT NULL,
    reason TEXT NOT NULL,
    refused_at REAL NOT NULL
);
"""
_ADDED_COLUMNS = (
    # (name, declaration): columns a file of an earlier version lacks. Its rows were left by a
    # process that is gone, so they are due now.
    ("state", "TEXT NOT NULL DEFAULT 'due' CHECK (state IN ('provisional', 'due'))"),
    ("queued_at", "REAL NOT NULL DEFAULT 0"),
    ("attempts", "INTEGER NOT NULL DEFAULT 0"),
)


@dataclass(frozen=True)
class OutboxStats:
    """What ``/metrics`` shows of the outbox."""

    due: int
    """Records finished and waiting for the tracker's acknowledgement."""
    provisional: int
    """Records of requests still running (written ahead)."""
    oldest_due_at: float | None
    """Wall time the oldest due record became due; None when none is."""
    refused: int
    """Records the tracker refused, kept in the ``refused`` table."""


class WorkOutbox:
    """Work records not yet acknowledged, by request id. Safe to call from any one thread at a time."""

    def __init__(self, path: Path | None, *, clock: Callable[[], float] = time.time) -> None:
        """Open (or create) the outbox at ``path``, exclusively; None keeps it in memory."""
        self.path = path
        self._clock = clock
        self._lock_fd: int | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._lock_fd = _exclusive_lock(path)
        self._connection = sqlite3.connect(
            ":memory:" if path is None else path, isolation_level=None, check_same_thread=False
        )
        self._lock = threading.Lock()
        with self._lock:
            self._connection.execute("PRAGMA journal_mode=WAL")
            self._connection.execute("PRAGMA synchronous=FULL")
            self._connection.executescript(_SCHEMA)
            self._add_columns()

    @classmethod
    def in_memory(cls, *, clock: Callable[[], float] = time.time) -> WorkOutbox:
        return cls(None, clock=clock)

    def _add_columns(self) -> None:
        present = {row[1] for row in self._connection.execute("PRAGMA table_info(outbox)")}
        for name, declaration in _ADDED_COLUMNS:
            if name not in present:
                self._connection.execute(f"ALTER TABLE outbox ADD COLUMN {name} {declaration}")
        self._connection.execute("UPDATE outbox SET queued_at = ? WHERE queued_at = 0", (self._clock(),))

    def put(self, record: WorkRecord, *, provisional: bool = False) -> None:
        """Store ``record``, replacing the one of the same request (its provisional version).

        A provisional record waits for its request's end; any other is due: sent until acknowledged.
        """
        state = "provisional" if provisional else "due"
        with self._lock:
            self._connection.execute(
                "INSERT INTO outbox(request_id, record_json, state, queued_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(request_id) DO UPDATE SET record_json = excluded.record_json, "
                "state = excluded.state, queued_at = excluded.queued_at, attempts = 0",
                (record.request_id, record_to_json(record), state, self._clock()),
            )

    def release_orphans(self) -> int:
        """Make every provisional record due: its request's process is gone (we hold the outbox
        alone), so what was written ahead is all anyone will know of it. Returns how many."""
        with self._lock:
            return self._connection.execute(
                "UPDATE outbox SET state = 'due', queued_at = ? WHERE state = 'provisional'", (self._clock(),)
            ).rowcount

    def due(self, limit: int) -> list[WorkRecord]:
        """Up to ``limit`` due records, those tried least first, then oldest: a record the tracker
        keeps failing does not hold back the ones behind it."""
        with self._lock:
            rows = self._connection.execute(
                "SELECT record_json FROM outbox WHERE state = 'due' ORDER BY attempts, rowid LIMIT ?", (limit,)
            ).fetchall()
        return [record_from_json(row[0]) for row in rows]

    def count_attempt(self, request_id: RequestId) -> None:
        """One more failed attempt to file ``request_id``'s record."""
        with self._lock:
            self._connection.execute("UPDATE outbox SET attempts = attempts + 1 WHERE request_id = ?", (request_id,))

    def remove(self, request_id: RequestId) -> None:
        """The tracker acknowledged the record: it is stored there."""
        with self._lock:
            self._connection.execute("DELETE FROM outbox WHERE request_id = ?", (request_id,))

    def refuse(self, record: WorkRecord, code: str, reason: str) -> None:
        """Move ``record`` to the refused table with the tracker's reason, in one transaction."""
        with self._lock, self._connection as connection:
            connection.execute("BEGIN IMMEDIATE")
            connection.execute(
                "INSERT OR REPLACE INTO refused(request_id, record_json, code, reason, refused_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (record.request_id, record_to_json(record), code, reason, self._clock()),
            )
            connection.execute("DELETE FROM outbox WHERE request_id = ?", (record.request_id,))

    def pending(self) -> list[WorkRecord]:
        """Every record not yet acknowledged (provisional or due), oldest first."""
        with self._lock:
            rows = self._connection.execute("SELECT record_json FROM outbox ORDER BY rowid").fetchall()
        return [record_from_json(row[0]) for row in rows]

    def refused_records(self) -> list[tuple[WorkRecord, str, str]]:
        """Each refused record with the tracker's error code and reason, oldest first."""
        with self._lock:
            rows = self._connection.execute("SELECT record_json, code, reason FROM refused ORDER BY rowid").fetchall()
        return [(record_from_json(text), code, reason) for text, code, reason in rows]

    def stats(self) -> OutboxStats:
        with self._lock:
            due, provisional, oldest = self._connection.execute(
                "SELECT count(*) FILTER (WHERE state = 'due'), count(*) FILTER (WHERE state = 'provisional'), "
                "min(queued_at) FILTER (WHERE state = 'due') FROM outbox"
            ).fetchone()
            (refused,) = self._connection.execute("SELECT count(*) FROM refused").fetchone()
        return OutboxStats(due, provisional, oldest, refused)

    def close(self) -> None:
        with self._lock:
            self._connection.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock


def _exclusive_lock(path: Path) -> int:
    descriptor = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise FailedPrecondition(
            f"another gateway is using the outbox {path}: give each gateway its own --data-dir"
        ) from None
    return descriptor


def record_to_json(record: WorkRecord) -> str:
    return json.dumps(asdict(record), sort_keys=True, separators=(",", ":"))


def record_from_json(text: str) -> WorkRecord:
    data: dict[str, Any] = json.loads(text)
    session = data["session_id"]
    return WorkRecord(
        request_id=RequestId(data["request_id"]),
        model=data["model"],
        status=data["status"],
        tokens_in=data["tokens_in"],
        tokens_out=data["tokens_out"],
        attribution=tuple(
            NodeWork(NodeId(share["node_id"]), LayerRange(**share["layers"]), share["tokens"])
            for share in data["attribution"]
        ),
        billing_units=data["billing_units"],
        started_at=data["started_at"],
        finished_at=data["finished_at"],
        session_id=None if session is None else SessionId(session),
    )
