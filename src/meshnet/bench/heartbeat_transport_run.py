"""The bench's side of the heartbeat transport experiment (``membership.heartbeat_transport``):
the echo server pinned where the tracker runs, the nodes where the generator runs, one
transport at a time, and the ratio that says whether streaming heartbeats are worth building."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshnet.bench.pinning import pinned
from meshnet.bench.tracker_scale_config import TRACKER_START_TIMEOUT_S, TrackerScaleConfig
from meshnet.core.errors import MeshnetError
from meshnet.membership.heartbeat_transport import READY_PREFIX
from meshnet.process.launcher import ChildProcess, LaunchSpec

MODULE = "meshnet.membership.heartbeat_transport"
MAX_NODES = 1000
"""Enough connections to look like a swarm; the per-call cost does not depend on more."""


def _one(config: TrackerScaleConfig, run_dir: Path, transport: str, nodes: int, seconds: float) -> dict[str, Any]:
    command, _ = pinned((sys.executable, "-m", MODULE, "serve", str(config.data_dir)), config.tracker_core)
    server = ChildProcess(LaunchSpec(f"echo-{transport}", command, run_dir / f"echo-{transport}.log", READY_PREFIX))
    try:
        ready = server.await_ready(time.monotonic() + TRACKER_START_TIMEOUT_S)
        spec = {
            "address": ready.first,
            "data_dir": str(config.data_dir),
            "transport": transport,
            "nodes": nodes,
            "interval_s": config.heartbeat_interval_s,
            "seconds": seconds,
            "server_pid": server.pid,
        }
        spec_path = run_dir / f"echo-{transport}.spec.json"
        spec_path.write_text(json.dumps(spec))
        client, _ = pinned((sys.executable, "-m", MODULE, "measure", str(spec_path)), config.generator_cores[0])
        done = subprocess.run(client, capture_output=True, text=True, timeout=seconds + 240, check=False)
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            return {"transport": transport, "error": f"exited {done.returncode}", "log_tail": done.stderr[-2000:]}
        result: dict[str, Any] = json.loads(lines[-1])
        return result
    except (MeshnetError, OSError, subprocess.TimeoutExpired) as error:
        return {"transport": transport, "error": f"{type(error).__name__}: {error}"}
    finally:
        server.stop()


def measure_transports(config: TrackerScaleConfig, run_dir: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """Unary and stream at the same nodes and interval; the server's CPU per heartbeat of each."""
    nodes, seconds = min(max(config.nodes), MAX_NODES), min(config.measure_s, 20.0)
    say(f"heartbeat transport: {nodes} nodes every {config.heartbeat_interval_s:g} s, {seconds:g} s each")
    results = {transport: _one(config, run_dir, transport, nodes, seconds) for transport in ("unary", "stream")}
    unary, stream = results["unary"].get("server_us_per_heartbeat"), results["stream"].get("server_us_per_heartbeat")
    summary: dict[str, Any] = {
        **results,
        "note": "echo servers (no registry work); connections made before the span; see membership.heartbeat_transport",
        "stream_over_unary_server_cost": round(stream / unary, 3) if unary and stream else None,
    }
    say(f"  server us/heartbeat: unary {unary}, stream {stream}")
    return summary
