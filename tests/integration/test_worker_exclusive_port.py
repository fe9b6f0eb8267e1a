"""A second worker on a port another worker holds refuses to start (issue 10, item 5).

gRPC sets SO_REUSEPORT by default, so without ``grpc.so_reuseport`` 0 the second worker bound
beside the first, printed ready and took half of its connections.

The workers run the fake backend (``worker_harness``'s default): real processes, gRPC, engine loops
and batching, without llama.cpp. The engine plays no part in binding the port.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from worker_harness import WorkerCluster, WorkerSpec

from meshnet.core.layers import LayerRange
from meshnet.deploy.launch.ready_lines import WorkerLine
from meshnet.route.shard_admin import fetch_capability
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire.frames import DEFAULT_MAX_FRAME_BYTES


def test_a_second_worker_on_a_busy_port_exits_with_a_clear_error(tmp_path: Path) -> None:
    with WorkerCluster(tmp_path) as cluster:
        (first,) = cluster.start(WorkerSpec(LayerRange(0, 3)))
        port = first.address.rsplit(":", 1)[1]
        second = WorkerSpec(LayerRange(3, 6), settings={"port": int(port)}).arguments(tmp_path / "second")
        (tmp_path / "second").mkdir()
        completed = subprocess.run(second, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert completed.returncode != 0, completed.stdout
        assert WorkerLine.PREFIX not in completed.stdout
        assert f"cannot listen on 127.0.0.1:{port}" in completed.stderr, completed.stderr
        assert "error [failed_precondition]" in completed.stderr and "port in use" in completed.stderr
        # The first worker still answers alone on its port.
        assert asyncio.run(_capability_layers(first.address)) == LayerRange(0, 3)


async def _capability_layers(address: str) -> LayerRange:
    pool = ChannelPool(DEFAULT_MAX_FRAME_BYTES)
    try:
        return (await fetch_capability(pool, address)).record.layers
    finally:
        await pool.close()
