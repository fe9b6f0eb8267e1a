"""The etcd store against a real etcd: the same promises as the SQLite store (idempotent work
records, an epoch that only goes up, quarantines with evidence), kept across clients (replicas)
and across the loss of one member of three."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from etcd_harness import needs_etcd
from tracker_samples import registration, work_record

from meshnet.core.audit_evidence import AuditedRequest, AuditRun, QuarantineEvidence
from meshnet.core.errors import FailedPrecondition, InvalidArgument, StorageDamaged, StorageUnavailable
from meshnet.core.ids import NodeId, RequestId
from meshnet.deploy.etcd_cluster import EtcdCluster, etcd_cluster, free_port
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.etcd.client import EtcdClient, EtcdRefused, Put, parse_endpoints
from meshnet.tracker.etcd.store import EPOCH_KEY, QUARANTINE_PREFIX, WORK_PREFIX, EtcdTrackerStore

pytestmark = needs_etcd


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    with etcd_cluster(tmp_path, size=1) as started:
        yield started


def replica(cluster: EtcdCluster) -> EtcdTrackerStore:
    return EtcdTrackerStore(EtcdClient(parse_endpoints(cluster.store)))


def test_a_record_reported_to_two_replicas_is_stored_once(cluster: EtcdCluster) -> None:
    first, second = replica(cluster), replica(cluster)
    record = work_record("req-1")
    assert first.record_work(record, recorded_at=10.0) is True
    assert second.record_work(record, recorded_at=11.0) is False
    assert second.list_work() == [record]
    with pytest.raises(FailedPrecondition, match="req-1"):
        second.record_work(work_record("req-1", tokens_out=33), recorded_at=12.0)
    assert first.get_work(RequestId("req-1")) == record


def test_records_keep_their_order_and_their_fields(cluster: EtcdCluster) -> None:
    store = replica(cluster)
    records = [work_record(f"req-{index:02}", tokens_out=index) for index in (3, 1, 2)]
    no_session = replace(work_record("req-x"), session_id=None, status="cancelled", attribution=())
    for record in [*records, no_session]:
        store.record_work(record, recorded_at=1.0)
    assert replica(cluster).list_work() == [*records, no_session]
    assert store.get_work(RequestId("missing")) is None


def test_a_disputed_record_is_settled_and_its_dispute_forgotten(cluster: EtcdCluster) -> None:
    store = replica(cluster)
    reported = work_record("req-1")
    judged = replace(reported, status="unverified")
    assert store.record_judged_work(reported, judged, "shards counted fewer tokens", 1.0) is True
    assert store.work_dispute(RequestId("req-1")) == "shards counted fewer tokens"
    assert store.record_work(reported, 2.0) is False  # the report again: a duplicate, not a conflict
    store.settle_work(RequestId("req-1"), "completed")
    assert store.work_dispute(RequestId("req-1")) is None
    assert store.get_work(RequestId("req-1")) == replace(reported, status="completed")


def test_the_epoch_only_goes_up_whichever_replica_writes(cluster: EtcdCluster) -> None:
    first, second = replica(cluster), replica(cluster)
    assert first.load_epoch() == 0
    first.save_epoch(5)
    second.save_epoch(3)
    assert second.load_epoch() == 5
    second.save_epoch(9)
    assert first.load_epoch() == 9


def test_a_quarantine_marks_the_record_and_is_seen_by_every_replica(cluster: EtcdCluster) -> None:
    first, second = replica(cluster), replica(cluster)
    first.record_work(work_record("req-1"), recorded_at=1.0)
    evidence = QuarantineEvidence(
        "one_request", (AuditedRequest(RequestId("req-1"), (AuditRun((NodeId("n-1"),), "abc"),)),)
    )
    assert first.quarantine_node(NodeId("n-1"), "disagreed", RequestId("req-1"), 5.0, evidence) is True
    assert first.quarantine_node(NodeId("n-0"), "older", None, 4.0) is False
    assert second.quarantined_nodes() == (NodeId("n-0"), NodeId("n-1"))
    assert second.quarantine_entries()[1].evidence == evidence
    assert second.get_work(RequestId("req-1")) == replace(work_record("req-1"), status="unverified")
    # The digest is unchanged: the original report sent again is still a duplicate.
    assert second.record_work(work_record("req-1"), recorded_at=6.0) is False
    second.clear_quarantine(NodeId("n-1"))
    assert first.quarantined_nodes() == (NodeId("n-0"),)


def test_nodes_seen_are_remembered(cluster: EtcdCluster) -> None:
    store = replica(cluster)
    node_id = NodeId("n-1")
    store.record_node(node_id, registration(0, 10), seen_at=1.0)
    assert replica(cluster).node_seen(node_id) is True
    assert store.node_seen(NodeId("n-2")) is False


def test_no_member_answering_is_storage_unavailable_not_a_crash() -> None:
    store = EtcdTrackerStore(EtcdClient((f"http://127.0.0.1:{free_port()}",), timeout_s=0.5))
    with pytest.raises(StorageUnavailable, match="no etcd member"):
        store.record_work(work_record("req-1"), recorded_at=1.0)


@pytest.mark.parametrize("store", ["etcd://", "etcd://host", "etcd://h:0", "etcd://h:1,h", "postgres://h:1"])
def test_a_malformed_store_address_is_refused(store: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_endpoints(store) if store.startswith("etcd") else TrackerConfig(store=store)


def test_writes_continue_when_one_member_of_three_is_killed(tmp_path: Path) -> None:
    with etcd_cluster(tmp_path, size=3) as three:
        store = replica(three)
        store.record_work(work_record("req-1"), recorded_at=1.0)
        three.members[0].kill()  # the member the client asked first
        store.record_work(work_record("req-2"), recorded_at=2.0)
        store.save_epoch(7)
        assert [record.request_id for record in replica(three).list_work()] == ["req-1", "req-2"]
        assert store.load_epoch() == 7


def test_malformed_values_in_etcd_are_typed_errors_naming_the_key(cluster: EtcdCluster) -> None:
    store = replica(cluster)
    store.record_work(work_record("req-1"), recorded_at=1.0)
    store.client.put(WORK_PREFIX + "req-2", b'{"record": {}}')  # no sha256: not a record of ours
    store.client.put(EPOCH_KEY, b"forty-two")
    store.client.put(QUARANTINE_PREFIX + "n-9", b"[1, 2]")
    with pytest.raises(StorageDamaged, match=EPOCH_KEY):
        store.load_epoch()
    with pytest.raises(StorageDamaged, match="req-2"):
        store.settle_work(RequestId("req-2"), "verified")
    with pytest.raises(StorageDamaged, match="req-2"):
        store.record_work(work_record("req-2"), recorded_at=2.0)
    # A listing leaves the bad one out; a quarantine that cannot be read still quarantines.
    assert [record.request_id for record in store.list_work()] == ["req-1"]
    assert store.quarantined_nodes() == (NodeId("n-9"),)


def test_a_request_etcd_refuses_is_a_permanent_error_not_an_unavailable_store(tmp_path: Path) -> None:
    with etcd_cluster(tmp_path, size=3) as three:
        client = EtcdClient(parse_endpoints(three.store))
        too_many = [Put(f"k{index}", b"v") for index in range(200)]  # etcd allows 128 per txn
        with pytest.raises(EtcdRefused, match="too many operations") as refused:
            client.write(too_many)
        assert not refused.value.retryable
        with pytest.raises(EtcdRefused, match="lease not found"):
            client.put("k", b"v", lease=12345)


class RangeCounting(EtcdClient):
    """A real client that remembers the limit of every range read (0: none, the whole range)."""

    def __init__(self, cluster: EtcdCluster) -> None:
        super().__init__(parse_endpoints(cluster.store))
        self.limits: list[int] = []

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path == "/v3/kv/range":
            self.limits.append(int(body.get("limit", 0)))
        return super()._post(path, body)


def test_work_records_are_listed_page_by_page_in_the_order_they_were_stored(cluster: EtcdCluster) -> None:
    # Ids whose key order is not their order of arrival: pages come in key order.
    ids = ["req-m", "req-c", "req-x", "req-a", "req-q", "req-b", "req-z"]
    writer = replica(cluster)
    for index, request_id in enumerate(ids):
        writer.record_work(work_record(request_id), recorded_at=float(index))
    client = RangeCounting(cluster)
    assert [record.request_id for record in EtcdTrackerStore(client, work_page=2).list_work()] == ids
    assert client.limits == [2, 2, 2, 2]  # never one read of every record


def test_a_listing_is_one_snapshot_though_records_arrive_between_its_pages(cluster: EtcdCluster) -> None:
    writer = replica(cluster)
    for request_id in ("req-1", "req-2", "req-3"):
        writer.record_work(work_record(request_id), recorded_at=1.0)
    pages = EtcdClient(parse_endpoints(cluster.store)).get_prefix_pages(WORK_PREFIX, 2)
    first = next(pages)
    writer.record_work(work_record("req-0"), recorded_at=2.0)  # sorts before the next page's start
    writer.record_work(work_record("req-4"), recorded_at=2.0)  # after it: not in the snapshot either
    rest = [kv for page in pages for kv in page]
    assert [kv.key.removeprefix(WORK_PREFIX) for kv in [*first, *rest]] == ["req-1", "req-2", "req-3"]
