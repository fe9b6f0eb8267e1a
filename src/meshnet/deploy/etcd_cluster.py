"""A local etcd cluster on loopback: the store of tracker replicas in tests and benchmarks.

Each member is an ``etcd`` process (Debian's ``etcd-server``, installed by ``make etcd``) with
its own data dir; tests kill members with SIGKILL to show what one dead member costs. A real
deployment runs its members on separate machines (README: "Tracker replicas").
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from meshnet.core.errors import FailedPrecondition, Unavailable

ETCD = shutil.which("etcd")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def kill(self) -> None:
        """SIGKILL: no goodbye to the cluster, as a crashed machine."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)


@dataclass
class EtcdCluster:
    members: list[EtcdMember]

    @property
    def store(self) -> str:
        """The tracker's ``--store`` value naming every member."""
        return "etcd://" + ",".join(f"127.0.0.1:{member.client_port}" for member in self.members)


def _start(member: EtcdMember, cluster: str, data_dir: Path, log: Path) -> None:
    if ETCD is None:
        raise FailedPrecondition("etcd is not installed: make etcd (Debian's etcd-server)")
    with log.open("ab") as output:  # the child holds its own copy: ours is closed at once
        member.process = subprocess.Popen(
            _command(ETCD, member, cluster, data_dir), stdout=output, stderr=subprocess.STDOUT
        )


def _command(etcd: str, member: EtcdMember, cluster: str, data_dir: Path) -> list[str]:
    return [
        etcd,
        f"--name={member.name}",
        f"--data-dir={data_dir / member.name}",
        f"--listen-client-urls={member.client_url}",
        f"--advertise-client-urls={member.client_url}",
        f"--listen-peer-urls=http://127.0.0.1:{member.peer_port}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{member.peer_port}",
        f"--initial-cluster={cluster}",
        "--initial-cluster-state=new",
        "--initial-cluster-token=meshnet-test",
        # Short elections keep a killed leader's replacement quick on a loaded test machine.
        "--heartbeat-interval=100",
        "--election-timeout=1000",
        # History is compacted by the replicas themselves (tracker.etcd.membership); etcd's
        # own periodic compaction is the safety net a deployment should keep too (README).
        "--auto-compaction-mode=periodic",
        "--auto-compaction-retention=5m",
    ]


def _wait_ready(cluster: EtcdCluster, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    pending = set(range(len(cluster.members)))
    while pending and time.monotonic() < deadline:
        exited = [member.name for member in cluster.members if member.process and member.process.poll() is not None]
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
def etcd_cluster(tmp_path: Path, size: int = 3) -> Iterator[EtcdCluster]:
    """``size`` members under ``tmp_path``, ready (a leader elected); all killed on exit."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, START_ATTEMPTS + 1):
        cluster = EtcdCluster([EtcdMember(f"m{index}", free_port(), free_port()) for index in range(size)])
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
    peers = ",".join(f"{member.name}=http://127.0.0.1:{member.peer_port}" for member in cluster.members)
    for member in cluster.members:
        _start(member, peers, data_dir, log_dir / f"etcd-{member.name}.log")
    _wait_ready(cluster)


def _kill_all(cluster: EtcdCluster) -> None:
    for member in cluster.members:
        member.kill()
