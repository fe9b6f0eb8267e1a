"""The tracker starts no OpenBLAS thread pool it never uses: every launcher starts it from
``tracker_launch`` (argv and ``TRACKER_ENVIRONMENT`` together), and a real interpreter importing
what ``meshnet tracker`` imports runs one thread with it (and, where it may run on several cores,
more without it: the oracle that the count can tell)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshnet.deploy.config import LocalSwarmConfig
from meshnet.deploy.launch.commands import TRACKER_ENVIRONMENT, tracker_launch
from meshnet.deploy.up import _tracker
from meshnet.tracker.config import TrackerConfig

IMPORTS_AND_COUNTS = "import os, meshnet.cli.main, meshnet.tracker.server; print(len(os.listdir('/proc/self/task')))"


def threads_after_tracker_imports(extra: dict[str, str]) -> int:
    environment = {k: v for k, v in os.environ.items() if k not in TRACKER_ENVIRONMENT}
    done = subprocess.run(
        [sys.executable, "-c", IMPORTS_AND_COUNTS],
        env={**environment, **extra},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return int(done.stdout.strip())


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc (Linux)")
def test_the_tracker_environment_leaves_the_tracker_one_thread_after_its_imports() -> None:
    assert threads_after_tracker_imports(TRACKER_ENVIRONMENT) == 1
    # OpenBLAS sizes its pool by the cores this process may run on (its affinity), not by the
    # machine's core count: with one allowed core there is no pool to tell apart.
    if len(os.sched_getaffinity(0)) > 1:
        assert threads_after_tracker_imports({}) > 1  # OpenBLAS's pool: what the environment avoids


def test_meshnet_up_starts_its_tracker_with_the_tracker_environment(tmp_path: Path) -> None:
    spec = _tracker(LocalSwarmConfig(model=tmp_path / "m.gguf", data_dir=tmp_path), tmp_path).spec
    assert TRACKER_ENVIRONMENT.items() <= spec.environment.items()


def test_a_tracker_launch_carries_its_environment_with_its_argv(tmp_path: Path) -> None:
    launch = tracker_launch(TrackerConfig(port=0), tmp_path)
    assert "tracker" in launch.argv
    assert {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}.items() <= launch.environment.items()
