"""etcd members started for tests and benchmarks (``deploy.etcd_cluster``) die with the process
that started them, however it dies: here a real Python process starts a real cluster and is
SIGKILLed (no ``finally`` runs), and every etcd it started goes within the lifeline's grace.
A member killed as a crash (``EtcdMember.kill``) leaves no zombie. Also the tether alone
(``process.tether``), holding a foreign program (``sleep``). Gone means gone from ``/proc``: a
zombie (state Z) still there is a process nobody reaped, and fails these tests."""

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

from meshnet.deploy.etcd_cluster import etcd_cluster
from meshnet.process.launcher import ChildProcess, LaunchSpec
from meshnet.process.lifeline import EXIT_GRACE_S, ORPHAN_EXIT_CODE

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


def state(pid: int) -> str | None:
    """The process's state letter from ``/proc/<pid>/stat`` (``Z``: a zombie), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat[stat.rindex(")") + 2]  # after "pid (comm) ": the name may hold spaces and ")"


def wait_gone(processes: list[psutil.Process]) -> list[tuple[int, str]]:
    """(pid, state) of the processes still in ``/proc`` after ``GONE_WITHIN_S``, zombies too
    (the live ones are killed then, so none outlives the test)."""
    deadline = time.monotonic() + GONE_WITHIN_S
    left = [(process.pid, state(process.pid)) for process in processes]
    while any(found is not None for _, found in left) and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [(pid, state(pid)) for pid, _ in left]
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    return [(pid, found) for pid, found in left if found is not None]


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
        # The tether's own SIGTERM path, or its lifeline's hard exit if that came first: either
        # way it is gone (the property); what it exits with races between the two.
        assert tether.wait_exit(GONE_WITHIN_S) in (128 + signal.SIGTERM, ORPHAN_EXIT_CODE)
    finally:
        tether.stop()


@needs_etcd
def test_a_member_killed_as_a_crash_leaves_no_zombie(tmp_path: Path) -> None:
    with etcd_cluster(tmp_path, size=1) as cluster:
        member = cluster.members[0]
        assert member.child is not None
        (etcd,) = programs_of([member.child.pid])
        assert etcd.name() == "etcd"
        member.kill()
        # Its tether reaped it before exiting: nothing is left in /proc, at once (no waiting).
        assert state(etcd.pid) is None
