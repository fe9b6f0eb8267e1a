"""Where and with what a run was measured: hardware, runtime versions, process memory, CPU noise.

Versions come from package metadata, so recording them never imports llama_cpp.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

from meshnet.bench.results import CpuSample, Environment, Hardware

RUNTIME_PACKAGES = ("llama-cpp-python", "numpy", "grpcio", "protobuf", "psutil")


def runtime_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in RUNTIME_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def hardware() -> Hardware:
    return Hardware(
        cpu_count=os.cpu_count() or 0,
        cpu_model=cpu_model(),
        memory_bytes=int(psutil.virtual_memory().total),
        platform=platform.platform(),
        machine=platform.machine(),
        python_executable=sys.executable,
    )


def environment() -> Environment:
    return Environment(runtime_versions(), hardware())


def rss_bytes(pid: int | None = None) -> int:
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


class CpuMeter:
    """How busy the machine was, and how much of that was us: the noise record of a round.

    ``foreign_cores`` is the CPU the rest of the machine used meanwhile (other engineers' tests
    on a shared box): a round with a large value is a noisy round.
    """

    def __init__(self, pids: Iterable[int] = ()) -> None:
        self._pids = [os.getpid(), *pids]
        self._system = psutil.cpu_times()
        self._ours = self._own_seconds()
        self._wall = time.monotonic()

    def _own_seconds(self) -> float:
        total = 0.0
        for pid in self._pids:
            try:
                times = psutil.Process(pid).cpu_times()
                total += times.user + times.system
            except psutil.Error:
                continue
        return total

    def read(self) -> CpuSample:
        now = psutil.cpu_times()
        wall = max(time.monotonic() - self._wall, 1e-9)
        busy = (sum(now) - now.idle - getattr(now, "iowait", 0.0)) - (
            sum(self._system) - self._system.idle - getattr(self._system, "iowait", 0.0)
        )
        ours = self._own_seconds() - self._ours
        return CpuSample(
            wall_s=wall,
            machine_busy_cores=busy / wall,
            own_cores=ours / wall,
            foreign_cores=max(busy - ours, 0.0) / wall,
        )
