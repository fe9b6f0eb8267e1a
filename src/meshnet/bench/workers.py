"""Worker processes for the meshnet lanes: start N ``meshnet worker``s on loopback, always stop them.

Each worker is started exactly as an operator would (``python -m meshnet worker``, its argv
rendered from a ``WorkerConfig`` by ``deploy.launch``) by the one process launcher: it prints its
ready line (``WorkerLine``), is stopped with SIGTERM then SIGKILL after a grace period, and holds a
lifeline, so a failed or killed bench never leaves a process behind.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from meshnet.bench.environment import rss_bytes
from meshnet.bench.pinning import pin_all
from meshnet.core.errors import Unavailable
from meshnet.core.ids import NodeId
from meshnet.core.layers import LayerRange
from meshnet.deploy.launch.commands import INSECURE, minted_identity, worker_command
from meshnet.deploy.launch.ready_lines import WorkerLine
from meshnet.node.config import LayerChoice, WorkerConfig
from meshnet.process.launcher import ChildProcess, LaunchSpec, launch_all, stop_all
from meshnet.security.swarm_dir import load_identity, local_identity
from meshnet.wire.tls import LinkSecurity

STOP_GRACE_S = 5.0


@dataclass(frozen=True)
class WorkerOptions:
    model: Path
    data_dir: Path
    threads: int
    max_sessions: int
    context: int
    prefill_chunk: int
    secure: bool = True
    """mTLS on every link, as a deployed swarm runs; False: ``--insecure`` (loopback plaintext)."""
    pin: bool = False
    """Pin worker i of the route to core i mod the usable cores (``bench.pinning``)."""


def client_security(data_dir: Path, secure: bool = True) -> LinkSecurity | None:
    """The bench's own (gateway-role) identity from the data dir's swarm CA, or None for plaintext."""
    if not secure:
        return None
    return LinkSecurity(load_identity(local_identity(data_dir, "bench-client", "gateway", time.time())))


def _spec(layers: LayerRange, options: WorkerOptions, log_path: Path) -> LaunchSpec:
    config = WorkerConfig(
        model=options.model,
        layer_choice=LayerChoice(layers),
        data_dir=options.data_dir,
        port=0,
        threads=options.threads,
        max_sessions=options.max_sessions,
        n_ctx_per_session=options.context,
        prefill_chunk=options.prefill_chunk,
    )
    security = minted_identity(options.data_dir, log_path.stem, "worker") if options.secure else INSECURE
    # Several llama.cpp processes share the cores: OpenMP threads spinning between graph ops
    # would steal the core the next shard needs (the same setting `meshnet up` uses).
    environment = {"GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT", "10000")}
    return LaunchSpec(f"worker {layers}", worker_command(config, security), log_path, WorkerLine.PREFIX, environment)


def _endpoint(child: ChildProcess) -> tuple[str, NodeId]:
    if child.ready is None:
        raise Unavailable(f"{child.name} is not serving")
    ready = WorkerLine.read(child.ready)
    return ready.address, NodeId(ready.node_id)


class WorkerSet:
    """The workers of one route, started together, ready in route order."""

    def __init__(self, name: str, ranges: Sequence[LayerRange], options: WorkerOptions, timeout_s: float) -> None:
        self.name = name
        self.ranges = tuple(ranges)
        logs = options.data_dir / "logs"
        specs = [_spec(layers, options, logs / f"bench-{name}-{layers.start}-{layers.stop}.log") for layers in ranges]
        self.workers: list[ChildProcess] = launch_all(specs, timeout_s)
        fingerprints = {WorkerLine.read(w.ready).recipe for w in self.workers if w.ready is not None}
        if len(fingerprints) != 1:
            self.stop()
            raise Unavailable(f"workers of {name} serve different recipes: {sorted(fingerprints)}")
        self.fingerprint = fingerprints.pop()
        self.pinning = pin_all(self.pids) if options.pin else "not pinned"

    @property
    def endpoints(self) -> tuple[tuple[str, NodeId], ...]:
        """Each worker's address and node id, in route order, as its ready line says."""
        return tuple(_endpoint(worker) for worker in self.workers)

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    def rss(self) -> list[int]:
        return [rss_bytes(w.pid) for w in self.workers]

    def stop(self) -> None:
        stop_all(self.workers, STOP_GRACE_S)
