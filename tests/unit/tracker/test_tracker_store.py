"""SQLite persistence: idempotent work records, durability settings, the epoch, nodes seen."""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from tracker_samples import registration, work_record

from meshnet.core.errors import FailedPrecondition
from meshnet.core.ids import NodeId, RequestId
from meshnet.core.tracking import WORK_STATUSES
from meshnet.tracker.store import SqliteTrackerStore
from meshnet.tracker.store_schema import SCHEMA_VERSION


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "tracker.sqlite3"


def test_the_same_record_reported_twice_is_stored_once(db_path: Path) -> None:
    store = SqliteTrackerStore(db_path)
    record = work_record("req-1")
    assert store.record_work(record, recorded_at=10.0) is True
    assert store.record_work(record, recorded_at=11.0) is False
    assert store.list_work() == [record]
    rows = sqlite3.connect(db_path).execute("SELECT count(*) FROM work_shares").fetchone()
    assert rows == (2,)  # the duplicate added no attribution rows either


def test_a_request_id_reused_with_other_content_is_refused(db_path: Path) -> None:
    store = SqliteTrackerStore(db_path)
    store.record_work(work_record("req-1", tokens_out=32), recorded_at=10.0)
    with pytest.raises(FailedPrecondition, match="req-1"):
        store.record_work(work_record("req-1", tokens_out=33), recorded_at=11.0)
    assert store.list_work() == [work_record("req-1", tokens_out=32)]


def test_records_round_trip_and_survive_reopening(db_path: Path) -> None:
    store = SqliteTrackerStore(db_path)
    records = [work_record(f"req-{index}", tokens_out=index) for index in range(5)]
    no_session = replace(work_record("req-x"), session_id=None, status="cancelled", attribution=())
    for record in [*records, no_session]:
        store.record_work(record, recorded_at=1.0)
    store.close()
    reopened = SqliteTrackerStore(db_path)
    assert reopened.list_work() == [*records, no_session]
    assert reopened.get_work(RequestId("req-3")) == records[3]
    assert reopened.get_work(RequestId("missing")) is None


def test_work_is_written_in_wal_mode_with_full_sync(db_path: Path) -> None:
    store = SqliteTrackerStore(db_path)
    assert sqlite3.connect(db_path).execute("PRAGMA journal_mode").fetchone() == ("wal",)
    # synchronous is per connection, so read it from the store's own (2 == FULL).
    assert store._connection.execute("PRAGMA synchronous").fetchone() == (2,)


def test_two_writers_racing_on_one_record_store_it_once(db_path: Path) -> None:
    # Two connections (as two processes would have) race the duplicate check against the insert.
    stores = [SqliteTrackerStore(db_path) for _ in range(2)]
    records = [work_record(f"req-{index}") for index in range(50)]
    results: list[list[bool]] = [[], []]

    def write(which: int) -> None:
        for record in records:
            results[which].append(stores[which].record_work(record, recorded_at=1.0))

    threads = [threading.Thread(target=write, args=(which,)) for which in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [a + b for a, b in zip(*results, strict=True)] == [1] * len(records)
    assert stores[0].list_work() == records


def test_the_epoch_only_goes_up_and_persists(db_path: Path) -> None:
    store = SqliteTrackerStore(db_path)
    assert store.load_epoch() == 0
    store.save_epoch(5)
    store.save_epoch(3)
    assert store.load_epoch() == 5
    store.close()
    assert SqliteTrackerStore(db_path).load_epoch() == 5


def test_nodes_seen_are_upserted(db_path: Path) -> None:
    store = SqliteTrackerStore(db_path)
    store.record_node(NodeId("n-1"), registration(0, 10), seen_at=1.0)
    store.record_node(NodeId("n-1"), registration(0, 20), seen_at=2.0)
    rows = (
        sqlite3.connect(db_path)
        .execute("SELECT node_id, layer_stop, first_seen, last_registered FROM nodes")
        .fetchall()
    )
    assert rows == [("n-1", 20, 1.0, 2.0)]


def test_every_status_is_stored_and_a_version_1_file_is_migrated(db_path: Path) -> None:
    store = SqliteTrackerStore(db_path)
    store.record_work(work_record("old-1"), recorded_at=1.0)
    store.close()
    # Turn the file into what schema version 1 wrote: its CHECK knew only three statuses.
    raw = sqlite3.connect(db_path, isolation_level=None)
    raw.execute("PRAGMA foreign_keys=OFF")
    raw.execute("PRAGMA legacy_alter_table=ON")  # keep work_shares pointing at work_records
    raw.execute("ALTER TABLE work_records RENAME TO current")
    raw.execute(
        "CREATE TABLE work_records (request_id TEXT PRIMARY KEY, session_id TEXT, model TEXT NOT NULL, "
        "status TEXT NOT NULL CHECK (status IN ('completed', 'cancelled', 'failed')), tokens_in INTEGER NOT NULL, "
        "tokens_out INTEGER NOT NULL, billing_units REAL NOT NULL, started_at REAL NOT NULL, "
        "finished_at REAL NOT NULL, recorded_at REAL NOT NULL, content_sha256 TEXT NOT NULL)"
    )
    raw.execute("INSERT INTO work_records SELECT * FROM current")
    raw.execute("DROP TABLE current")
    raw.execute("UPDATE meta SET value = 1 WHERE key = 'schema_version'")
    raw.close()
    migrated = SqliteTrackerStore(db_path)
    records = [replace(work_record(f"req-{status}"), status=status) for status in WORK_STATUSES]
    for record in records:
        assert migrated.record_work(record, recorded_at=2.0) is True
    assert migrated.list_work() == [work_record("old-1"), *records]
    version = sqlite3.connect(db_path).execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    assert version == (SCHEMA_VERSION,)


def test_a_judged_record_keeps_its_verdict_and_reason_and_stays_idempotent(db_path: Path) -> None:
    store = SqliteTrackerStore(db_path)
    reported = work_record("req-1")
    disputed = replace(reported, status="disputed")
    assert store.record_judged_work(reported, disputed, "claims more than the shards computed", 1.0)
    assert store.get_work(RequestId("req-1")) == disputed
    assert store.work_dispute(RequestId("req-1")) == "claims more than the shards computed"
    # The gateway retrying its report is a duplicate of what it reported, not of the verdict.
    assert store.record_judged_work(reported, disputed, "claims more than the shards computed", 2.0) is False
    assert store.record_work(reported, recorded_at=2.0) is False
    with pytest.raises(FailedPrecondition):
        store.record_judged_work(replace(reported, tokens_out=99), disputed, "", 2.0)
    store.settle_work(RequestId("req-1"), "completed")
    assert store.get_work(RequestId("req-1")) == reported
    assert store.work_dispute(RequestId("req-1")) is None


def test_nodes_once_registered_are_seen(db_path: Path) -> None:
    store = SqliteTrackerStore(db_path)
    store.record_node(NodeId("n-1"), registration(0, 10), seen_at=1.0)
    assert store.node_seen(NodeId("n-1")) and not store.node_seen(NodeId("ghost"))
