"""The tracker's /metrics endpoint against real trackers on loopback: the heartbeats and
registrations each replica answered, labelled with its replica id, so a scrape of every replica
shows how the nodes spread over them.

Oracle: the beats the test itself sent to each tracker (over the client's heartbeat stream, as a
worker sends them). Each tracker's clock stands still, so no node expires and nothing else beats.
"""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import pytest
from manual_clock import ManualClock
from prometheus_client.parser import text_string_to_metric_families
from test_tracker_service import registration

from meshnet.core.ids import NodeId
from meshnet.core.tracking import NodeLoad
from meshnet.membership.tracker_client import TrackerClient
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.server import RunningTracker, start_tracker

pytestmark = pytest.mark.timeout(60)


def scrape(tracker: RunningTracker) -> dict[tuple[str, str], float]:
    """Every sample of ``tracker``'s /metrics: (sample name, replica label) -> value."""
    assert tracker.metrics is not None
    with urllib.request.urlopen(f"http://{tracker.metrics.address}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, sample.labels.get("replica", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def beat(tracker: RunningTracker, node: str, port: int, beats: int) -> None:
    async with TrackerClient(tracker.address, timeout_s=2.0) as client:
        node_id = (await client.register(registration(0, 8, f"127.0.0.1:{port}"), NodeId(node))).node_id
        for sent in range(beats):
            assert (await client.heartbeat(node_id, NodeLoad(free_sessions=sent))).known


async def test_each_replica_counts_the_heartbeats_and_registrations_it_served(tmp_path: Path) -> None:
    trackers = [
        await start_tracker(
            TrackerConfig(
                port=0, db_path=tmp_path / f"{name}.sqlite3", heartbeat_interval_s=0.2, replica_id=name, metrics_port=0
            ),
            clock=ManualClock(1000.0),
        )
        for name in ("east", "west")
    ]
    east, west = trackers
    try:
        before = await asyncio.to_thread(scrape, east)
        assert before[("meshnet_tracker_heartbeats_total", "east")] == 0
        await beat(east, "w-1", 9001, beats=5)
        await beat(east, "w-2", 9002, beats=2)
        await beat(west, "w-3", 9003, beats=3)
        seen = {tracker.config.replica_id: await asyncio.to_thread(scrape, tracker) for tracker in trackers}
        assert seen["east"][("meshnet_tracker_heartbeats_total", "east")] == 7
        assert seen["east"][("meshnet_tracker_registrations_total", "east")] == 2
        assert seen["east"][("meshnet_tracker_live_nodes", "east")] == 2
        assert seen["west"][("meshnet_tracker_heartbeats_total", "west")] == 3
        assert seen["west"][("meshnet_tracker_registrations_total", "west")] == 1
        assert seen["west"][("meshnet_tracker_live_nodes", "west")] == 1
    finally:
        for tracker in trackers:
            await tracker.stop(grace_s=0)
