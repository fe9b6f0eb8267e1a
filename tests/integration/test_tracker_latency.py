"""Observed latency between nodes: workers probe the candidate next hops the tracker names and
report round trips in their heartbeats; the tracker costs seams with them.

The workers run the fake backend (``worker_harness``'s default): real processes, gRPC, engine loops
and batching, without llama.cpp. The engine plays no part in the probes measured here.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from worker_harness import WorkerCluster, WorkerSpec

from meshnet.core.layers import LayerRange
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.server import start_tracker


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_workers_report_round_trips_to_their_candidate_next_hops(tmp_path: Path) -> None:
    # Workers start before the in-process tracker does (they retry registering until it
    # answers): forking a test process that already runs a gRPC server is unsafe.
    port = _free_port()
    settings = {"tracker": f"127.0.0.1:{port}"}
    with WorkerCluster(tmp_path / "workers") as cluster:
        head, middle, _tail = cluster.start(
            WorkerSpec(LayerRange(0, 2), settings=settings),
            WorkerSpec(LayerRange(2, 4), settings=settings),
            WorkerSpec(LayerRange(4, 6), settings=settings),
        )
        config = TrackerConfig(port=port, db_path=tmp_path / "t.sqlite3", heartbeat_interval_s=0.3)
        tracker = await start_tracker(config)
        try:
            registry = tracker.registry
            assert registry is not None
            table: dict = {}
            for _ in range(80):
                table = registry.latency_table()
                if len(table) >= 2:
                    break
                await asyncio.sleep(0.25)
            ids = {view.record.address: view.node_id for view in registry.node_views()}
            assert (ids[head.address], ids[middle.address]) in table, table
            assert all(0.0 < ms < 1000.0 for ms in table.values()), table
        finally:
            await tracker.stop()
