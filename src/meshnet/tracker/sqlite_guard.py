"""How the tracker trusts its SQLite file: an integrity check before first use, SQLite's errors
as typed ones.

A damaged database is refused at start (``StorageDamaged``, naming the file and what to do):
serving it would answer from damaged pages and write new records beside them. A failing disk
is not a refusal of what the caller sent: disk full, I/O errors and a locked file become
``StorageUnavailable`` (UNAVAILABLE, retryable), so a gateway keeps its record and sends it
again once the disk is back. Untyped, they reached the gateway as UNKNOWN, which it took for
a final answer and dropped the record (issue 29, finding 8).

Which check: ``PRAGMA integrity_check`` reads every page and cross-checks every index against
its table; ``quick_check`` skips the cross-check. Measured on the shared 2-core machine (work
records of three shares each): 10k records (3.8 MB) 0.03 s full / 0.01 s quick, 100k (39 MB)
0.39 / 0.16 s, 1M (390 MB) 4.1 / 1.6 s. The full check runs up to ``FULL_CHECK_MAX_BYTES``,
where it costs under half a second; above it the quick one keeps a restart near the K1 budget
(serving again within 2 s) up to about a million records.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from meshnet.core.errors import MeshnetError, StorageDamaged, StorageUnavailable

logger = logging.getLogger(__name__)

FULL_CHECK_MAX_BYTES = 64 * 1024 * 1024
"""Largest database (with its WAL) checked with ``integrity_check``; larger ones get ``quick_check``."""
_DAMAGED = ("SQLITE_CORRUPT", "SQLITE_NOTADB")
_PROBLEMS_SHOWN = 5


def damaged_message(path: Path, detail: str) -> str:
    return (
        f"the tracker database {path} is damaged ({detail}); the tracker will not serve it or write to it. "
        f"Restore {path} from a backup; or recover what SQLite can read (`sqlite3 {path} .recover | "
        f"sqlite3 {path.name}.recovered`) and start with --db on that file; or move {path} and its -wal and "
        "-shm files aside to start over: nodes register again within a heartbeat and the route epoch "
        "continues from the epoch file beside it and what workers report, but the work records and "
        "quarantines in it are lost."
    )


def storage_error(error: sqlite3.Error, path: Path) -> MeshnetError:
    """The typed error for ``error`` of the database at ``path``."""
    name = getattr(error, "sqlite_errorname", "") or "SQLITE_ERROR"
    if name.startswith(_DAMAGED):
        return StorageDamaged(damaged_message(path, str(error)))
    return StorageUnavailable(
        f"tracker storage {path} failed: {error} ({name}); nothing was stored, retry once the disk is back"
    )


def _is_storage_failure(error: sqlite3.Error) -> bool:
    # Operational errors are the disk's and the file's (full, I/O, busy, locked, read-only);
    # a bare DatabaseError is SQLite's "malformed" or "not a database". Constraint and
    # programming errors are ours, and must stay loud.
    return isinstance(error, sqlite3.OperationalError) or type(error) is sqlite3.DatabaseError


@contextmanager
def translated(path: Path) -> Iterator[None]:
    """Raise SQLite's storage failures inside the block as ``StorageUnavailable`` / ``StorageDamaged``."""
    try:
        yield
    except sqlite3.Error as error:
        if not _is_storage_failure(error):
            raise
        typed = storage_error(error, path)
        logger.warning("%s", typed.message)
        raise typed from error


def check_integrity(connection: sqlite3.Connection, path: Path) -> None:
    """Refuse a damaged database (``StorageDamaged``) before anything reads or writes it."""
    size = sum(file.stat().st_size for file in (path, Path(f"{path}-wal")) if file.exists())
    pragma = "integrity_check" if size <= FULL_CHECK_MAX_BYTES else "quick_check"
    started = time.perf_counter()
    try:
        rows = connection.execute(f"PRAGMA {pragma}({_PROBLEMS_SHOWN})").fetchall()
    except sqlite3.Error as error:  # not a database at all, or a damaged header
        if not _is_storage_failure(error):
            raise
        if isinstance(error, sqlite3.OperationalError):
            raise storage_error(error, path) from error
        raise StorageDamaged(damaged_message(path, str(error))) from error
    problems = [str(row[0]) for row in rows]
    if problems != ["ok"]:
        raise StorageDamaged(damaged_message(path, f"PRAGMA {pragma}: " + "; ".join(problems)))
    logger.info("%s passed PRAGMA %s in %.2f s (%.1f MB)", path, pragma, time.perf_counter() - started, size / 1e6)
