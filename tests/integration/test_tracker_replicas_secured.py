"""Secured replicas (mTLS, route tickets) on copies of one swarm dir sharing one etcd cluster: a gateway
on replica B generates over workers that registered (and were dialled back) at replica A only,
so B's route tickets are accepted by A's shards, and B judges the gateway's work record by the
counts those shards reported to A."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import httpx
import pytest
from etcd_harness import needs_etcd
from swarm_harness import (
    HEARTBEAT_S,
    MISSED_HEARTBEATS,
    START_TIMEOUT_S,
    Swarm,
    chat_body,
    start_component,
    write_tiny_model,
)

from meshnet.deploy.etcd_cluster import etcd_cluster
from meshnet.deploy.launch.commands import tracker_launch
from meshnet.deploy.launch.ready_lines import TrackerLine
from meshnet.membership.tracker_client import TrackerClient
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.etcd.client import EtcdClient, parse_endpoints
from meshnet.tracker.etcd.store import EtcdTrackerStore

pytestmark = [needs_etcd, pytest.mark.timeout(120)]


async def listed_nodes(address: str, swarm: Swarm) -> int:
    async with TrackerClient(address, timeout_s=3.0, security=swarm.security) as client:
        return sum(model.nodes for model in await client.list_models() if model.routable)


def test_a_gateway_on_one_replica_generates_over_workers_registered_at_another(tmp_path: Path) -> None:
    root = tmp_path / "swarm"
    root.mkdir()
    with etcd_cluster(tmp_path / "etcd", size=3) as cluster, Swarm(root, write_tiny_model(root)) as swarm:
        swarm.start_tracker(store=cluster.store, replica_id="a")
        swarm.start_workers("0:3", "3:6")
        swarm.wait_routable(2)
        # Replica b, as on another machine: a copy of the swarm dir (its CA, revocations and the
        # tracker's certificate), as README says to give every replica.
        copy = tmp_path / "swarm-b"
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns("*.log", "*.sock"))
        config = TrackerConfig(
            port=0, join_port=0, store=cluster.store, replica_id="b", heartbeat_interval_s=HEARTBEAT_S,
            missed_heartbeats=MISSED_HEARTBEATS, shutdown_grace_s=0.5,
        )  # fmt: skip
        launch = tracker_launch(config, copy)
        replica_b = start_component("tracker-b", launch.argv, root / "tracker-b.log", TrackerLine, launch.environment)
        try:
            replica_a = swarm.tracker_address
            swarm.tracker_address = TrackerLine.read(replica_b.await_ready(time.monotonic() + START_TIMEOUT_S)).address
            swarm.wait_routable(2)  # now asking b, which heard of the workers only through etcd
            base_url = swarm.start_gateway()
            response = httpx.post(
                f"{base_url}/v1/chat/completions",
                json=chat_body(max_tokens=8, stream=False),
                timeout=60,
                headers=swarm.auth,
            )
            assert response.status_code == 200, response.text
            assert response.json()["usage"]["completion_tokens"] > 0
            # The gateway's record, reported to b, is in the shared store, borne out by the
            # shards' counts, which they reported to a (shared through etcd).
            store = EtcdTrackerStore(EtcdClient(parse_endpoints(cluster.store)))
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                records = store.list_work()
                if records and store.work_dispute(records[0].request_id) is None:
                    break
                time.sleep(0.2)
            assert len(records) == 1
            assert store.work_dispute(records[0].request_id) is None
            assert records[0].status == "completed"
            assert asyncio.run(listed_nodes(replica_a, swarm)) == 2
        finally:
            replica_b.stop()
