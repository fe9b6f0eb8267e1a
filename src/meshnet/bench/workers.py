"""Worker processes for the meshnet lanes: start N ``meshnet worker``s on loopback, always stop them.

Each worker is started exactly as an operator would (``python -m meshnet.cli worker``), prints
``meshnet worker ready HOST:PORT node=... recipe=...``, and is stopped with SIGTERM, then
SIGKILL after a grace period, so a failed bench never leaves a process behind.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from meshnet.bench.environment import rss_bytes
from meshnet.core.errors import Unavailable
from meshnet.core.events import RouteHop
from meshnet.core.ids import NodeId
from meshnet.core.layers import LayerRange

READY_PREFIX = "meshnet worker ready "
STOP_GRACE_S = 5.0


@dataclass(frozen=True)
class WorkerOptions:
    model: Path
    data_dir: Path
    threads: int
    max_sessions: int
    context: int
    prefill_chunk: int


def child_environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    # Several llama.cpp processes share the cores: OpenMP threads spinning between graph ops
    # would steal the core the next shard needs (the same setting `meshnet up` uses).
    env.setdefault("GOMP_SPINCOUNT", "10000")
    return env


class WorkerProcess:
    def __init__(self, layers: LayerRange, options: WorkerOptions, log_path: Path) -> None:
        self.layers = layers
        self.log_path = log_path
        self.address = self.node_id = self.fingerprint = ""
        command = [
            sys.executable,
            "-m",
            "meshnet.cli",
            "--data-dir",
            str(options.data_dir),
            "worker",
            "--model",
            str(options.model),
            "--layers",
            f"{layers.start}:{layers.stop}",
            "--port",
            "0",
            "--threads",
            str(options.threads),
            "--max-sessions",
            str(options.max_sessions),
            "--context",
            str(options.context),
            "--prefill-chunk",
            str(options.prefill_chunk),
        ]
        self._lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        with log_path.open("w") as log:
            self.process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                text=True,
                env=child_environment(),
                start_new_session=True,
            )
        threading.Thread(target=self._pump, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _pump(self) -> None:
        # Drain stdout for the process's life, so a chatty worker never blocks on a full pipe.
        if self.process.stdout is not None:
            for line in self.process.stdout:
                self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def await_ready(self, deadline: float) -> None:
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise Unavailable(f"worker {self.layers} was not ready in time; see {self.log_path}") from None
            if line is None:
                code = self.process.poll()
                raise Unavailable(f"worker {self.layers} exited ({code}) during start-up; see {self.log_path}")
            if line.startswith(READY_PREFIX):
                fields = line[len(READY_PREFIX) :].split()
                values = dict(item.split("=", 1) for item in fields[1:] if "=" in item)
                self.address, self.node_id, self.fingerprint = fields[0], values["node"], values["recipe"]
                return

    def hop(self) -> RouteHop:
        return RouteHop(NodeId(self.node_id), self.address, self.layers)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_GRACE_S)


class WorkerSet:
    """The workers of one route, started together, ready in route order."""

    def __init__(self, name: str, ranges: Sequence[LayerRange], options: WorkerOptions, timeout_s: float) -> None:
        self.name = name
        logs = options.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.workers: list[WorkerProcess] = []
        try:
            for layers in ranges:
                log_path = logs / f"bench-{name}-{layers.start}-{layers.stop}.log"
                self.workers.append(WorkerProcess(layers, options, log_path))
            deadline = time.monotonic() + timeout_s
            for worker in self.workers:
                worker.await_ready(deadline)
        except BaseException:
            self.stop()
            raise
        fingerprints = {w.fingerprint for w in self.workers}
        if len(fingerprints) != 1:
            self.stop()
            raise Unavailable(f"workers of {name} serve different recipes: {sorted(fingerprints)}")
        self.fingerprint = fingerprints.pop()

    @property
    def hops(self) -> tuple[RouteHop, ...]:
        return tuple(w.hop() for w in self.workers)

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    def rss(self) -> list[int]:
        return [rss_bytes(w.pid) for w in self.workers]

    def stop(self) -> None:
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        for worker in self.workers:
            worker.stop()
