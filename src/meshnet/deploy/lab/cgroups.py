"""Memory caps and CPU pinning for lab nodes: cgroup v1 where it is mounted, else cgroup v2.

A process joins its node's groups by writing its own pid before it execs the component, so no
Python runs between fork and exec in the supervisor (see ``launch.py``).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from meshnet.deploy.lab.plan import PREFIX, LabNode, LabPlan, object_tag
from meshnet.deploy.lab.system import LabUnavailable, kill_pid

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class NodeGroups:
    """The cgroup directories one node's processes join."""

    directories: tuple[Path, ...]

    def procs_files(self) -> tuple[Path, ...]:
        return tuple(directory / "cgroup.procs" for directory in self.directories)


def _v1() -> bool:
    return (CGROUP_ROOT / "memory" / "memory.limit_in_bytes").exists()


def make_node_groups(plan: LabPlan, node: LabNode, *, role: str = "worker") -> NodeGroups:
    """The node's groups for one role: ``worker`` (and any other, such as a probe of the whole
    model under the same cap) gets the node's memory cap; ``control`` (the tracker and gateway
    of node 0) shares the node's core but not the cap, which is the memory a worker machine
    offers the model."""
    capped = role != "control"
    name = f"{plan.cgroup}/n{node.index}-{role}"
    if _v1():
        memory = CGROUP_ROOT / "memory" / name
        cpuset = CGROUP_ROOT / "cpuset" / name
        for directory in (memory.parent, memory, cpuset.parent, cpuset):
            directory.mkdir(exist_ok=True)
        for directory in (cpuset.parent, cpuset):
            # A v1 cpuset starts empty and refuses tasks until cpus and mems are set.
            (directory / "cpuset.mems").write_text(_read(CGROUP_ROOT / "cpuset" / "cpuset.mems"))
        (cpuset.parent / "cpuset.cpus").write_text(_read(CGROUP_ROOT / "cpuset" / "cpuset.cpus"))
        (cpuset / "cpuset.cpus").write_text(str(node.cpu))
        if capped and node.memory_mb is not None:
            (memory / "memory.limit_in_bytes").write_text(str(node.memory_mb * 1024 * 1024))
        return NodeGroups((memory, cpuset))
    unified = CGROUP_ROOT / name
    if not (CGROUP_ROOT / "cgroup.controllers").exists():
        raise LabUnavailable("no cgroup v1 memory controller and no cgroup v2 hierarchy at /sys/fs/cgroup")
    unified.parent.mkdir(exist_ok=True)
    (unified.parent / "cgroup.subtree_control").write_text("+memory +cpuset")
    unified.mkdir(exist_ok=True)
    (unified / "cpuset.cpus").write_text(str(node.cpu))
    if capped and node.memory_mb is not None:
        (unified / "memory.max").write_text(str(node.memory_mb * 1024 * 1024))
    return NodeGroups((unified,))


def _read(path: Path) -> str:
    return path.read_text().strip()


def peak_memory_bytes(groups: NodeGroups) -> int:
    """The most memory the group's processes have held at once (v1 max_usage / v2 peak)."""
    for directory in groups.directories:
        for name in ("memory.max_usage_in_bytes", "memory.peak"):
            path = directory / name
            if path.exists():
                return int(path.read_text().strip())
    return 0


def oom_kills(groups: NodeGroups) -> int:
    """How often the kernel hit this node's memory cap with no room left (v1 failcnt / v2 oom_kill)."""
    for directory in groups.directories:
        events = directory / "memory.events"
        if events.exists():
            for line in events.read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        oom = directory / "memory.oom_control"
        if oom.exists():
            for line in oom.read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    return 0


def _roots() -> list[Path]:
    return [CGROUP_ROOT / "memory", CGROUP_ROOT / "cpuset"] if _v1() else [CGROUP_ROOT]


def object_tags() -> frozenset[str]:
    """The tags of every lab that has a cgroup on this host now."""
    tops = [top.name for root in _roots() if root.exists() for top in root.glob(f"{PREFIX}-*")]
    return frozenset(tag for tag in map(object_tag, tops) if tag is not None)


def remove_groups(tag: str) -> list[str]:
    """Kill what is still inside lab ``tag``'s cgroups, then remove them (children first)."""
    removed: list[str] = []
    for root in _roots():
        if not root.exists():
            continue
        for top in sorted(root.glob(f"{PREFIX}-*")):
            if object_tag(top.name) != tag:
                continue
            for directory in [*sorted(top.rglob("*"), key=lambda p: -len(p.parts)), top]:
                if directory.is_dir():
                    _empty(directory)
                    _rmdir(directory)
            removed.append(f"cgroup {top}")
    return removed


def _empty(directory: Path) -> None:
    procs = directory / "cgroup.procs"
    for _ in range(50):
        pids = [int(p) for p in procs.read_text().split()] if procs.exists() else []
        if not pids:
            return
        for pid in pids:
            kill_pid(pid)
        time.sleep(0.05)


def _rmdir(directory: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(directory)
