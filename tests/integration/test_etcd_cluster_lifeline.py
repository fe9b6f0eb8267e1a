"""etcd members started for tests and benchmarks (``deploy.etcd_cluster``) die with the process
that started them, however it dies: here a real Python process starts a real cluster and is
SIGKILLed (no ``finally`` runs), and every etcd it started goes within the lifeline's grace.
Also the tether alone (``process.tether``), holding a foreign program (``sleep``)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from etcd_harness import needs_etcd

from meshnet.process.launcher import ChildProcess, LaunchSpec
from meshnet.process.lifeline import EXIT_GRACE_S

pytestmark = pytest.mark.timeout(90)
GONE_WITHIN_S = EXIT_GRACE_S + 10.0
"""The tether stops its program within the lifeline's grace; the rest is margin for a loaded
2-core machine. The bound is what matters (without a tether etcd never goes), not its size."""

STARTER = """
import sys, time
from pathlib import Path
from meshnet.deploy.etcd_cluster import etcd_cluster
with etcd_cluster(Path(sys.argv[1]), size=2):
    print("ready", flush=True)
    time.sleep(600)
"""


def programs_of(tethers: list[int]) -> list[psutil.Process]:
    return [child for pid in tethers for child in psutil.Process(pid).children()]


def wait_gone(processes: list[psutil.Process]) -> list[psutil.Process]:
    """The processes still running after ``GONE_WITHIN_S`` (killed then, so none outlives the test)."""
    _, alive = psutil.wait_procs(processes, timeout=GONE_WITHIN_S)
    alive = [process for process in alive if process.status() != psutil.STATUS_ZOMBIE]
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    return alive


@needs_etcd
def test_etcd_members_die_with_the_process_that_started_them(tmp_path: Path) -> None:
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert starter.stdout is not None
        assert starter.stdout.readline() == "ready\n"
        descendants = psutil.Process(starter.pid).children(recursive=True)
        members = [process for process in descendants if process.name() == "etcd"]
        assert len(members) == 2
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait()
    assert wait_gone(members) == []


def test_the_tether_stops_its_program_when_its_lifeline_is_cut(tmp_path: Path) -> None:
    command = (sys.executable, "-m", "meshnet.process.tether", "sleep", "600")
    tether = ChildProcess(LaunchSpec("tether", command, tmp_path / "tether.log", ready_prefix=""))
    try:
        deadline = time.monotonic() + 30
        while not programs_of([tether.pid]) and time.monotonic() < deadline:
            time.sleep(0.05)
        program = programs_of([tether.pid])
        assert [process.name() for process in program] == ["sleep"]
        tether._lifeline.cut()
        assert wait_gone(program) == []
        assert tether.wait_exit(GONE_WITHIN_S) == 128 + signal.SIGTERM
    finally:
        tether.stop()
