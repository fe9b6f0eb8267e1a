"""Work-record retention and a full store against a real etcd: records leave when their bucket's
lease expires (etcd deletes them itself), a record reported again after that is stored again,
records inside the retention are listed, and a store past its space quota (NOSPACE) answers a
typed error that says what to do, logged once."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from etcd_harness import needs_etcd
from tracker_samples import work_record

from meshnet.core.errors import StorageFull, StorageUnavailable
from meshnet.core.ids import RequestId
from meshnet.deploy.etcd_cluster import EtcdCluster, etcd_cluster
from meshnet.tracker.etcd.client import EtcdClient, parse_endpoints
from meshnet.tracker.etcd.retention import RetentionPolicy
from meshnet.tracker.etcd.store import DISPUTE_PREFIX, WORK_PREFIX, EtcdTrackerStore

pytestmark = [needs_etcd, pytest.mark.timeout(120)]

SHORT_S = 2.0
"""The short retention: its lease's TTL is 3 s (a bucket of 1 s), above etcd's 2 s minimum TTL."""
TINY_QUOTA_BYTES = 300_000
"""A quota a few hundred records fill (each ~700 B of backend: etcd_retention.json)."""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    with etcd_cluster(tmp_path, size=1) as started:
        yield started


def store(cluster: EtcdCluster, retention_s: float) -> EtcdTrackerStore:
    return EtcdTrackerStore(EtcdClient(parse_endpoints(cluster.store)), retention=RetentionPolicy(retention_s))


def eventually(condition: Callable[[], bool], within_s: float, what: str) -> None:
    """Waits for etcd's lease expiry (checked every 0.5 s by etcd); the bound is only there so a
    retention that never expires fails instead of hanging."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s} s: {what}")
        time.sleep(0.2)


def test_records_leave_after_the_retention_and_a_fresh_report_is_stored_again(cluster: EtcdCluster) -> None:
    short, kept = store(cluster, SHORT_S), store(cluster, 3600.0)
    expiring = work_record("req-short")
    disputed = work_record("req-disputed")
    assert short.record_work(expiring, recorded_at=1.0)
    assert short.record_judged_work(disputed, replace(disputed, status="unverified"), "fewer tokens", 1.0)
    assert kept.record_work(work_record("req-kept"), recorded_at=1.0)
    assert [record.request_id for record in kept.list_work()] == ["req-short", "req-disputed", "req-kept"]

    # Gone by etcd's own doing: nobody here deletes anything.
    eventually(lambda: short.get_work(RequestId("req-short")) is None, 30.0, "the short-retention record expired")
    eventually(lambda: short.get_work(RequestId("req-disputed")) is None, 30.0, "the disputed record expired")
    assert short.work_dispute(RequestId("req-disputed")) is None  # its dispute went with it
    assert [record.request_id for record in short.list_work()] == ["req-kept"]  # inside its retention

    # Idempotency lasts as long as the record: reported again after it, it is new again.
    assert short.record_work(expiring, recorded_at=2.0) is True
    assert short.record_work(expiring, recorded_at=3.0) is False
    assert [record.request_id for record in kept.list_work()] == ["req-kept", "req-short"]


def test_a_settled_record_keeps_its_lease(cluster: EtcdCluster) -> None:
    short = store(cluster, 3600.0)
    reported = work_record("req-1")
    short.record_judged_work(reported, replace(reported, status="unverified"), "fewer tokens", 1.0)
    stored = short.client.get(WORK_PREFIX + "req-1")
    dispute = short.client.get(DISPUTE_PREFIX + "req-1")
    assert stored is not None and dispute is not None and stored.lease != 0 and dispute.lease == stored.lease
    short.settle_work(RequestId("req-1"), "completed")
    settled = short.client.get(WORK_PREFIX + "req-1")
    assert settled is not None and settled.lease == stored.lease  # a put without it would keep it for ever
    assert short.get_work(RequestId("req-1")) == replace(reported, status="completed")


def test_a_lease_etcd_lost_is_replaced_not_a_failure(cluster: EtcdCluster) -> None:
    replica = store(cluster, 3600.0)
    replica.record_work(work_record("req-1"), recorded_at=1.0)
    first = replica.leases.lease_now()
    httpx.post(cluster.members[0].client_url + "/v3/lease/revoke", json={"ID": str(first)})  # a restored store
    assert replica.record_work(work_record("req-2"), recorded_at=2.0) is True
    stored = replica.client.get(WORK_PREFIX + "req-2")
    assert stored is not None and stored.lease not in (0, first)


def fill(replica: EtcdTrackerStore, limit: int = 5_000) -> StorageFull:
    """Records until etcd refuses one; the error it refused with."""
    for index in range(limit):
        try:
            replica.record_work(work_record(f"fill-{index:05}"), recorded_at=1.0)
        except StorageFull as error:
            return error
    raise AssertionError(f"{limit} records did not fill a {TINY_QUOTA_BYTES}-byte quota")


def test_a_full_store_answers_a_typed_error_that_says_what_to_do_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with etcd_cluster(tmp_path, size=1, quota_backend_bytes=TINY_QUOTA_BYTES) as cluster:
        replica = store(cluster, 3600.0)
        with caplog.at_level(logging.ERROR, logger="meshnet.tracker.etcd.client"):
            error = fill(replica)
            for index in range(3):  # still full: refused each time, logged no more
                with pytest.raises(StorageFull):
                    replica.record_work(work_record(f"more-{index}"), recorded_at=1.0)
        assert isinstance(error, StorageUnavailable) and error.code == "storage_full" and error.retryable
        for advice in ("NOSPACE", "defrag", "alarm disarm", "--quota-backend-bytes", "--work-retention"):
            assert advice in error.message
        logged = [entry for entry in caplog.records if "NOSPACE" in entry.getMessage()]
        assert len(logged) == 1
        # Reads still work: what was stored before the alarm is all there.
        assert len(replica.list_work()) > 100
