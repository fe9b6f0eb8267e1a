"""The tracker's disk (issue 29, finding 8): a full disk is "retry" and stores nothing, a
damaged file is refused before anything reads or writes it, the epoch outlives the database."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

import pytest
from tracker_samples import work_record

from meshnet.core.errors import StorageDamaged, StorageUnavailable
from meshnet.tracker.epoch_file import epoch_file_beside
from meshnet.tracker.registry import NodeRegistry
from meshnet.tracker.store import SqliteTrackerStore


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "tracker.sqlite3"


def _fill_to_the_brim(store: SqliteTrackerStore) -> None:
    """SQLite's own "database or disk is full" (SQLITE_FULL): no page may be added any more."""
    (pages,) = store._connection.execute("PRAGMA page_count").fetchone()
    store._connection.execute(f"PRAGMA max_page_count = {pages}")


def test_a_full_disk_is_a_retryable_storage_error_and_the_record_is_stored_once_space_returns(db_path: Path) -> None:
    store = SqliteTrackerStore(db_path)
    store.record_work(work_record("before"), 1.0)
    _fill_to_the_brim(store)
    records = [work_record(f"full-{n}", tokens_out=n + 1) for n in range(200)]
    with pytest.raises(StorageUnavailable) as raised:
        for record in records:
            store.record_work(record, 2.0)
    assert raised.value.retryable and "SQLITE_FULL" in raised.value.message and str(db_path) in raised.value.message
    store._connection.execute("PRAGMA max_page_count = 1073741823")
    for record in records:
        store.record_work(record, 3.0)  # the same calls, once the disk is back
    stored = sorted(record.request_id for record in store.list_work())
    assert stored == sorted(["before", *(record.request_id for record in records)])


def _damage(db_path: Path) -> bytes:
    with contextlib.closing(SqliteTrackerStore(db_path)) as store:
        for n in range(300):
            store.record_work(work_record(f"r-{n}"), 1.0)
    with contextlib.closing(sqlite3.connect(db_path)) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        connection.execute("PRAGMA journal_mode=DELETE")
    data = bytearray(db_path.read_bytes())
    page = 4096
    middle = (len(data) // page // 2) * page
    data[middle + 8 : middle + page] = os.urandom(page - 8)
    db_path.write_bytes(bytes(data))
    return bytes(data)


def test_a_damaged_database_is_refused_naming_the_file_and_left_untouched(db_path: Path) -> None:
    damaged = _damage(db_path)
    with pytest.raises(StorageDamaged) as raised:
        SqliteTrackerStore(db_path)
    assert str(db_path) in raised.value.message and "Restore" in raised.value.message
    assert not raised.value.retryable
    assert db_path.read_bytes() == damaged


def test_a_file_that_is_no_database_is_refused(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(b"not a database, but the size of a page header " * 100)
    with pytest.raises(StorageDamaged, match="damaged"):
        SqliteTrackerStore(db_path)


def test_the_epoch_survives_an_emptied_database_through_the_file_beside_it(db_path: Path) -> None:
    with contextlib.closing(SqliteTrackerStore(db_path)) as store:
        store.save_epoch(127)
    assert epoch_file_beside(db_path).read_text() == "127\n"
    db_path.unlink()
    db_path.touch()  # an empty file where the database was
    with contextlib.closing(SqliteTrackerStore(db_path)) as store:
        assert store.load_epoch() == 127
        store.save_epoch(128)
    assert epoch_file_beside(db_path).read_text() == "128\n"
    assert not list(db_path.parent.glob("*.tmp"))


def test_an_unreadable_epoch_file_leaves_the_databases_epoch(db_path: Path) -> None:
    with contextlib.closing(SqliteTrackerStore(db_path)) as store:
        store.save_epoch(9)
    epoch_file_beside(db_path).write_text("garbage")
    with contextlib.closing(SqliteTrackerStore(db_path)) as store:
        assert store.load_epoch() == 9


def test_a_registering_node_that_knows_a_later_epoch_moves_the_registry_above_it() -> None:
    registry = NodeRegistry(clock=lambda: 0.0, heartbeat_interval_s=1.0, epoch=2, session_ttl_s=60.0)
    assert registry.adopt_epoch(127)
    assert registry.epoch == 128
    assert not registry.adopt_epoch(5)  # never down
    assert not registry.adopt_epoch(0)
    assert registry.epoch == 128
