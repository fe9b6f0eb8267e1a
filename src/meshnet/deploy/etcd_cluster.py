"""A local etcd cluster on loopback: the store of tracker replicas in tests and benchmarks.

Each member is an ``etcd`` process (Debian's ``etcd-server``, installed by ``make etcd``) with
its own data dir; tests kill members with SIGKILL to show what one dead member costs. A real
deployment runs its members on separate machines (README: "Tracker replicas").

Members start through the one launcher (``process.launcher.ChildProcess``) under a tether
(``process.tether``: etcd cannot watch a lifeline itself), so they die with the process that
started them however it dies: a test run killed mid-way leaves no etcd holding ports and disk.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from meshnet.core.errors import FailedPrecondition, Unavailable
from meshnet.process.launcher import ChildProcess, LaunchSpec
from meshnet.process.tether import CRASH_SIGNAL

ETCD = shutil.which("etcd")
CRASH_WAIT_S = 10.0
"""For a tether to kill and reap its etcd (a SIGKILL and a wait: instant unless the machine is loaded)."""
PROGRESS_NOTIFY_S = 5.0
"""Under the tracker's watch idle timeout (``tracker.etcd.client.WATCH_IDLE_S``, 10 s)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    child: ChildProcess | None = None
    """The tether running this member (``process.tether``), in a process group with it."""

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def exited(self) -> bool:
        return self.child is not None and not self.child.alive

    def kill(self) -> None:
        """SIGKILL to etcd: no goodbye to the cluster, as a crashed machine. Through its tether,
        which reaps it (a SIGKILL to both at once would leave etcd a zombie nobody reaps)."""
        if self.child is not None:
            self.child.send_signal(CRASH_SIGNAL)
            self.child.wait_exit(CRASH_WAIT_S)
            self.child.stop()  # reaps the tether (SIGTERM, then SIGKILL, if it hung), cuts the lifeline


@dataclass
class EtcdCluster:
    members: list[EtcdMember]
    progress_notify_s: float = PROGRESS_NOTIFY_S
    """How often a member tells a quiet watch it is alive (etcd's default: 10 min)."""
    quota_backend_bytes: int = 0
    """Each member's ``--quota-backend-bytes`` (0: etcd's default, 2 GB): past it etcd raises
    its NOSPACE alarm and refuses every write (tests fill a tiny one)."""

    @property
    def store(self) -> str:
        """The tracker's ``--store`` value naming every member."""
        return "etcd://" + ",".join(f"127.0.0.1:{member.client_port}" for member in self.members)


def _start(member: EtcdMember, cluster: EtcdCluster, data_dir: Path, log: Path) -> None:
    if ETCD is None:
        raise FailedPrecondition("etcd is not installed: make etcd (Debian's etcd-server)")
    command = (sys.executable, "-m", "meshnet.process.tether", *_command(ETCD, member, cluster, data_dir))
    # No ready line: etcd logs to stderr (the log) and _wait_ready asks it instead.
    member.child = ChildProcess(LaunchSpec(f"etcd {member.name}", command, log, ready_prefix=""), append_log=True)


def _command(etcd: str, member: EtcdMember, cluster: EtcdCluster, data_dir: Path) -> list[str]:
    peers = ",".join(f"{each.name}=http://127.0.0.1:{each.peer_port}" for each in cluster.members)
    return [
        etcd,
        f"--name={member.name}",
        f"--data-dir={data_dir / member.name}",
        f"--listen-client-urls={member.client_url}",
        f"--advertise-client-urls={member.client_url}",
        f"--listen-peer-urls=http://127.0.0.1:{member.peer_port}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{member.peer_port}",
        f"--initial-cluster={peers}",
        "--initial-cluster-state=new",
        "--initial-cluster-token=meshnet-test",
        # Short elections keep a killed leader's replacement quick on a loaded test machine.
        "--heartbeat-interval=100",
        "--election-timeout=1000",
        # History is compacted by the replicas themselves (tracker.etcd.membership); etcd's
        # own periodic compaction is the safety net a deployment should keep too (README).
        "--auto-compaction-mode=periodic",
        "--auto-compaction-retention=5m",
        # A quiet watch (the replicas' epoch) hears from its member within the client's idle
        # read timeout, so it is known alive, not reopened (tracker.etcd.client.WATCH_IDLE_S).
        f"--experimental-watch-progress-notify-interval={cluster.progress_notify_s:g}s",
        *([f"--quota-backend-bytes={cluster.quota_backend_bytes}"] if cluster.quota_backend_bytes else []),
    ]


def _wait_ready(cluster: EtcdCluster, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    pending = set(range(len(cluster.members)))
    while pending and time.monotonic() < deadline:
        exited = [member.name for member in cluster.members if member.exited]
        if exited:  # most often a port another process took between free_port() and etcd's bind
            raise Unavailable(f"etcd members {exited} exited while starting (their logs say why)")
        for index in list(pending):
            with contextlib.suppress(httpx.HTTPError):
                # A linearizable read succeeds only once the cluster elected a leader.
                if (
                    httpx.post(cluster.members[index].client_url + "/v3/kv/range", json={"key": "eA=="}).status_code
                    == 200
                ):
                    pending.discard(index)
        time.sleep(0.1)
    if pending:
        raise Unavailable(f"etcd members {sorted(pending)} did not become ready in {timeout_s} s")


def leader_index(cluster: EtcdCluster) -> int:
    """The index of the member the cluster elected leader now (asked of the first member that
    answers): the member whose death costs an election, the hardest one to kill."""
    for member in cluster.members:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            status = httpx.post(member.client_url + "/v3/maintenance/status", json={}, timeout=5.0).json()
            for index, candidate in enumerate(cluster.members):
                mine = httpx.post(candidate.client_url + "/v3/maintenance/status", json={}, timeout=5.0).json()
                if mine["header"]["member_id"] == status["leader"]:
                    return index
    raise Unavailable("no etcd member says which member leads")


START_ATTEMPTS = 3
"""A port free when picked may be taken before etcd binds it: a fresh set of ports then."""


@contextlib.contextmanager
def etcd_cluster(
    tmp_path: Path, size: int = 3, progress_notify_s: float = PROGRESS_NOTIFY_S, quota_backend_bytes: int = 0
) -> Iterator[EtcdCluster]:
    """``size`` members under ``tmp_path``, ready (a leader elected); all killed on exit."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, START_ATTEMPTS + 1):
        members = [EtcdMember(f"m{index}", free_port(), free_port()) for index in range(size)]
        cluster = EtcdCluster(members, progress_notify_s, quota_backend_bytes)
        try:
            _start_all(cluster, tmp_path / f"etcd-{attempt}", tmp_path)
            break
        except Unavailable:
            _kill_all(cluster)
            if attempt == START_ATTEMPTS:
                raise
    try:
        yield cluster
    finally:
        _kill_all(cluster)


def _start_all(cluster: EtcdCluster, data_dir: Path, log_dir: Path) -> None:
    for member in cluster.members:
        _start(member, cluster, data_dir, log_dir / f"etcd-{member.name}.log")
    _wait_ready(cluster)


def _kill_all(cluster: EtcdCluster) -> None:
    for member in cluster.members:
        member.kill()
