"""A tracker replica's work records in etcd, all real processes: kept only ``--work-retention``
(then etcd deletes them, and the same report is new again); and a full store (NOSPACE: past
``--quota-backend-bytes``) answers work reports ``storage_full`` (a typed, retryable error
saying what frees space, so a gateway keeps its records) while routes and heartbeats, which
live in the replica's memory, go on being served and no live node is expired."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from etcd_harness import needs_etcd
from test_tracker_replicas import HEAD, INTERVAL_S, TAIL, Node, replicas, routes_both, wait_for
from worker_harness import sample_work_record as record

from meshnet.core.durations import Seconds
from meshnet.core.errors import StorageFull
from meshnet.core.ids import NodeId, RequestId
from meshnet.deploy.etcd_cluster import etcd_cluster
from meshnet.membership.tracker_client import TrackerClient
from meshnet.tracker.etcd.client import EtcdClient, parse_endpoints
from meshnet.tracker.etcd.store import EtcdTrackerStore

pytestmark = [needs_etcd, pytest.mark.timeout(120)]

QUOTA_BYTES = 600_000
"""Room for the replicas' own keys (epoch slots, membership digests), filled by the test."""


async def test_the_retention_flag_reaches_the_store_records_leave_and_come_back_new(tmp_path: Path) -> None:
    with etcd_cluster(tmp_path, size=1) as cluster:
        async with replicas(cluster, tmp_path, count=1, work_retention_s=Seconds(2)) as running:
            client = TrackerClient(running[0][1], timeout_s=5.0)
            reader = EtcdTrackerStore(EtcdClient(parse_endpoints(cluster.store)))
            try:
                assert not (await client.report_work(record("req-1"), timeout_s=5.0)).duplicate
                assert (await client.report_work(record("req-1"), timeout_s=5.0)).duplicate  # inside it
                assert [kept.request_id for kept in reader.list_work()] == ["req-1"]
                await wait_for(lambda: asyncio.to_thread(lambda: reader.get_work(RequestId("req-1")) is None),
                               30.0, "etcd deleted the record after its 2 s retention")  # fmt: skip
                assert not (await client.report_work(record("req-1"), timeout_s=5.0)).duplicate
            finally:
                reader.close()
                await client.close()


def fill(store: str) -> None:
    """Write 4 kB values until etcd raises its NOSPACE alarm."""
    client = EtcdClient(parse_endpoints(store))
    try:
        for index in range(2_000):
            try:
                client.put(f"filler/{index:05}", b"x" * 4096)
            except StorageFull:
                return
        raise AssertionError(f"2000 writes of 4 kB did not fill a {QUOTA_BYTES}-byte quota")
    finally:
        client.close()


async def test_a_full_store_refuses_records_with_storage_full_and_routes_go_on(tmp_path: Path) -> None:
    with etcd_cluster(tmp_path, size=1, quota_backend_bytes=QUOTA_BYTES) as cluster:
        async with replicas(cluster, tmp_path, count=1) as running:
            client = TrackerClient(running[0][1], timeout_s=5.0)
            await client.register(HEAD, NodeId("head"))
            await client.register(TAIL, NodeId("tail"))
            head, tail = Node("head", [client], 0), Node("tail", [client], 0)
            beats = [asyncio.create_task(node.heartbeat_forever()) for node in (head, tail)]
            try:
                await wait_for(lambda: routes_both(client), 10.0, "the replica routes head→tail")
                assert not (await client.report_work(record("req-before"), timeout_s=5.0)).duplicate
                await asyncio.to_thread(fill, cluster.store)

                for index in range(3):
                    with pytest.raises(StorageFull, match="--quota-backend-bytes"):
                        await client.report_work(record(f"req-full-{index}"), timeout_s=5.0)
                await asyncio.sleep(2 * 3 * INTERVAL_S)  # two expiry windows with the store full
                assert await routes_both(client), "the replica stopped routing with its store full"
                assert head.unknown_to == [] and tail.unknown_to == []
            finally:
                for beat in beats:
                    beat.cancel()
                await asyncio.gather(*beats, return_exceptions=True)
                await client.close()
        log = (tmp_path / "r0.log").read_text().splitlines()
        # Logged once by the store's client (its advice in full), however many writes it refused.
        # (The membership exchange also warns on each failed exchange: its own log, not this one.)
        alarms = [line for line in log if "meshnet.tracker.etcd.client" in line and "NOSPACE" in line]
        assert len(alarms) == 1, alarms
