"""``bench-tracker-scale --mode replica-kill`` at small scale: 3 etcd members and 3 tracker
replicas (real processes, mTLS), 20 simulated nodes and a gateway at a few calls a second; one
replica SIGKILLed, then the etcd leader. No gateway call may fail beyond its one retry, no
acknowledged work record may be missing from the store, no live node may be expired; and the
record check itself catches a record that is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from etcd_harness import needs_etcd
from worker_harness import sample_work_record

from meshnet.bench.replica_kill import measure_replica_kill, records_found
from meshnet.bench.tracker_scale_config import TrackerScaleConfig
from meshnet.core.ids import RequestId
from meshnet.deploy.etcd_cluster import etcd_cluster
from meshnet.tracker.etcd.client import EtcdClient, parse_endpoints
from meshnet.tracker.etcd.store import EtcdTrackerStore

pytestmark = [needs_etcd, pytest.mark.timeout(120)]


def test_a_killed_replica_and_etcd_leader_lose_no_call_record_or_node(tmp_path: Path) -> None:
    config = TrackerScaleConfig(
        data_dir=tmp_path / "data", mode="replica-kill", nodes=(20,), route_rates=(4.0,), warmup_s=2.0,
        measure_s=12.0, kill_tracker_at_s=3.0, kill_store_at_s=7.0, heartbeat_interval_s=1.0,
        # Every node and the gateway start at r0, the replica killed: the hardest case (spread,
        # only a third of them would lose their replica, and the gateway perhaps not).
        tracker_order="listed",
    )  # fmt: skip
    out = tmp_path / "replica-kill.json"
    measure_replica_kill(config, out, say=lambda line: None)

    (point,) = json.loads(out.read_text())["points"]
    assert "error" not in point, point
    assert [kill["error"] for kill in point["disruptions"]["kills"]] == [None, None]
    # The gateway asked the killed replica first: its next call failed there and was retried.
    assert point["gateway_calls_retried"] >= 1
    assert point["gateway_calls_failed"] == {"choose_route": 0, "report_work": 0}
    records = point["records"]
    assert records["acknowledged"] >= 20 and records["lost"] == 0
    assert records["found"] == records["acknowledged"]
    assert point["live_nodes_wrongly_expired"] == 0 and point["reregistrations"] == 0
    assert point["warmup"]["live_nodes_wrongly_expired"] == 0
    # Every node heartbeats a live replica again after each kill, within the measured span.
    assert all(kill["every_node_answered_again_after_s"] is not None for kill in point["disruptions"]["kills"])
    assert point["verdict"]["held"] is True


def test_the_record_check_finds_an_acknowledged_record_missing_from_the_store(tmp_path: Path) -> None:
    with etcd_cluster(tmp_path / "etcd", size=3) as cluster:
        store = EtcdTrackerStore(EtcdClient(parse_endpoints(cluster.store)))
        try:
            stored = sample_work_record("stored-1")
            assert store.record_work(stored, recorded_at=stored.finished_at)
        finally:
            store.close()
        acknowledged = tmp_path / "acknowledged.json"
        acknowledged.write_text(json.dumps(["stored-1", str(RequestId("never-stored"))]))
        found = records_found(cluster, acknowledged)
    assert found["acknowledged"] == 2 and found["found"] == 1
    assert found["lost"] == 1 and found["lost_examples"] == ["never-stored"]
