"""The tracker-scale load generator keeps working: a tiny run against a real tracker process
(mTLS, dial-back, pinned), and a tracker that forgets live nodes is caught doing it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest

from meshnet.bench.tracker_scale import SCHEMA, measure_tracker_scale, quick, result_path
from meshnet.bench.tracker_scale_config import TrackerScaleConfig
from meshnet.core.tracking import HeartbeatTransport
from meshnet.membership.load_generator import LoadSpec, run_load
from meshnet.security.swarm_dir import init_swarm
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.server import start_tracker
from meshnet.tracker.swarm_service import load_tracker_security

pytestmark = pytest.mark.timeout(120)


def test_a_tiny_run_measures_a_real_tracker_process(tmp_path: Path) -> None:
    # Two generator processes, so their figures are merged as a large run's are.
    base = TrackerScaleConfig(data_dir=tmp_path / "data", out_dir=tmp_path / "out", label="tiny", generator_processes=2)
    config = quick(base)
    path = result_path(config)
    measure_tracker_scale(config, path, say=lambda line: None)

    written = json.loads(path.read_text())
    assert written["schema"] == SCHEMA and written["complete"] is True
    assert written["environment"]["usable_cores"] and "load_average_at_start" in written["environment"]
    (point,) = written["points"]
    assert "error" not in point, point
    calls = point["calls"]
    # Every node heartbeats at the tracker's interval: 10 nodes every 0.2 s for 2 s is ~100.
    assert 70 <= calls["heartbeat"]["count"] <= 110
    assert calls["choose_route"]["count"] >= 5 and calls["report_work"]["count"] >= 5
    assert point["errors"] == {}
    assert point["join"]["registered"] == 10 and point["nodes"] == 10
    assert point["generator_processes"] == 2 and len(point["generator"]) == 2
    if {0, 1} <= os.sched_getaffinity(0) and shutil.which("taskset"):
        assert point["tracker_unpinned"] is None and point["generators_not_pinned"] == []
    assert point["live_nodes_wrongly_expired"] == 0 and point["reregistrations"] == 0
    assert point["tracker"]["cpu_cores"] > 0 and point["tracker"]["peak_rss_bytes"] > 0
    assert point["valid"] is True
    assert point["heartbeat_transport"] == "stream"  # as workers beat, unless told otherwise
    transport = written["heartbeat_transport"]
    for name in ("unary", "stream"):
        assert transport[name]["server_us_per_heartbeat"] > 0, transport[name]
        assert transport[name]["heartbeats_per_s"] > 0


def small_load(trackers: tuple[str, ...], data_dir: Path, *, nodes: int, warmup_s: float, measure_s: float) -> LoadSpec:
    """A few nodes against trackers at a 0.2 s heartbeat interval, 5 routes and records a second."""
    return LoadSpec(
        trackers=trackers,
        data_dir=data_dir,
        nodes=nodes,
        routes_per_s=5,
        records_per_s=5,
        warmup_s=warmup_s,
        measure_s=measure_s,
        join_spread_s=0.2,
    )


async def test_live_nodes_a_tracker_forgets_are_counted(tmp_path: Path) -> None:
    init_swarm(tmp_path, time.time())
    security = load_tracker_security(tmp_path, time.time())
    config = TrackerConfig(port=0, join_port=0, db_path=tmp_path / "tracker.sqlite3", heartbeat_interval_s=0.2)
    tracker = await start_tracker(config, security=security)
    spec = small_load((tracker.address,), tmp_path, nodes=5, warmup_s=0.5, measure_s=3.0)

    async def forget_everyone() -> None:
        await asyncio.sleep(1.5)  # after the join (5 nodes take well under a second)
        # The tracker drops every live node (a clock jump no longer does: the tracker takes a
        # jump for its own stall and expires nobody for it, ``tracker.liveness``).
        registry = tracker.registry
        assert registry is not None
        for entry in registry.entries():
            registry.deregister(entry.node_id)

    try:
        summary, _ = await asyncio.gather(run_load(spec), forget_everyone())
    finally:
        await tracker.stop(0)
        security.book.close()
    assert summary["join"]["registered"] == 5
    # Counted wherever it fell, warm-up or measured span: each live node was told "unknown" once.
    warmup = summary["warmup"]
    assert summary["live_nodes_wrongly_expired"] + warmup["live_nodes_wrongly_expired"] >= 5
    assert summary["reregistrations"] + warmup["reregistrations"] >= 5


@pytest.mark.parametrize("transport", ["stream", "unary"])
async def test_simulated_nodes_heartbeat_on_either_transport(tmp_path: Path, transport: HeartbeatTransport) -> None:
    init_swarm(tmp_path, time.time())
    security = load_tracker_security(tmp_path, time.time())
    config = TrackerConfig(port=0, join_port=0, db_path=tmp_path / "tracker.sqlite3", heartbeat_interval_s=0.2)
    tracker = await start_tracker(config, security=security)
    spec = replace(
        small_load((tracker.address,), tmp_path, nodes=4, warmup_s=0.5, measure_s=2.0), heartbeat_transport=transport
    )
    try:
        summary = await run_load(spec)
    finally:
        await tracker.stop(0)
        security.book.close()
    assert summary["heartbeat_transport"] == transport
    # 4 nodes every 0.2 s for 2 s is ~40 beats, all answered "known" on this transport.
    assert summary["calls"]["heartbeat"]["count"] >= 25
    # (Routes may find no cover over 4 random ranges: only the heartbeats are judged here.)
    assert not [key for key in summary["errors"] if key.startswith("heartbeat")], summary["errors"]
    assert summary["live_nodes_wrongly_expired"] == 0


async def test_nodes_and_gateway_load_move_to_the_next_tracker_when_one_dies(tmp_path: Path) -> None:
    """The hook of a replica-kill run: with several tracker addresses, a dead one's nodes and
    the gateway load carry on at the next (here an independent tracker, where they register again)."""
    init_swarm(tmp_path, time.time())
    security = load_tracker_security(tmp_path, time.time())
    trackers = []
    for name in ("a", "b"):
        config = TrackerConfig(port=0, join_port=0, db_path=tmp_path / f"{name}.sqlite3", heartbeat_interval_s=0.2)
        trackers.append(await start_tracker(config, security=security))
    first, second = trackers
    # Two trackers that share nothing: every node and the gateway must start at the first (the
    # listed order), or some would register at the second only and the first's death would move
    # fewer than the 3 counted below (with spread orders: 2 or fewer of 6 in 34% of runs).
    spec = replace(
        small_load((first.address, second.address), tmp_path, nodes=6, warmup_s=2.5, measure_s=2.0),
        tracker_order="listed",
    )

    async def kill_the_first() -> None:
        await asyncio.sleep(1.0)  # joined, not yet measuring
        await first.stop(0)

    try:
        summary, _ = await asyncio.gather(run_load(spec), kill_the_first())
    finally:
        await second.stop(0)
        security.book.close()
    calls = summary["calls"]
    assert summary["errors"] == {}, summary["errors"]
    assert calls["heartbeat"]["count"] >= 40  # 6 nodes every 0.2 s for 2 s: 60, all at the second
    assert calls["choose_route"]["count"] >= 5 and calls["report_work"]["count"] >= 5
    assert summary["warmup"]["reregistrations"] >= 3  # the first tracker's nodes joined the second
