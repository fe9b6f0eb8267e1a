"""A durable outbox of work records the tracker has not acknowledged yet, in one SQLite file.

Records are what contributors are paid from, and a gateway holds them only until the tracker
acknowledges them; without a disk copy a crash (or SIGKILL) of the gateway loses every record
still queued for an unreachable tracker. So a record is written here *before* it is sent, kept
until the tracker acknowledges it, and whatever is left is sent again at the next start-up.
Sending twice is harmless: the tracker stores a record once per request id.

Each request is written twice: when its route is accepted, as ``unverified`` (what the gateway
knows then), and once it ends, replaced by its real outcome. A gateway that dies mid-request
thus still leaves a record, honestly labelled as one nobody could vouch for (DGR-013).

Like the tracker's store: WAL with ``synchronous=FULL`` (a write is on disk before the record is
sent), and an exclusive lock on the directory, because a second gateway on the same file would
replay this one's in-flight requests as unverified.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading
from dataclasses import asdict
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
"""


class WorkOutbox:
    """Work records not yet acknowledged, by request id. Safe to call from any one thread at a time."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock_fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise FailedPrecondition(
                f"another gateway is using the outbox {path}: give each gateway its own --data-dir"
            ) from None
        self._connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()
        with self._lock:
            self._connection.execute("PRAGMA journal_mode=WAL")
            self._connection.execute("PRAGMA synchronous=FULL")
            self._connection.executescript(_SCHEMA)

    def put(self, record: WorkRecord) -> None:
        """Store ``record``, replacing the one of the same request (its provisional version)."""
        with self._lock:
            self._connection.execute(
                "INSERT INTO outbox(request_id, record_json) VALUES (?, ?) "
                "ON CONFLICT(request_id) DO UPDATE SET record_json = excluded.record_json",
                (record.request_id, record_to_json(record)),
            )

    def remove(self, request_id: RequestId) -> None:
        with self._lock:
            self._connection.execute("DELETE FROM outbox WHERE request_id = ?", (request_id,))

    def pending(self) -> list[WorkRecord]:
        """Every record not yet acknowledged, oldest first."""
        with self._lock:
            rows = self._connection.execute("SELECT record_json FROM outbox ORDER BY rowid").fetchall()
        return [record_from_json(row[0]) for row in rows]

    def close(self) -> None:
        with self._lock:
            self._connection.close()
        os.close(self._lock_fd)  # closing the descriptor releases the flock


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
