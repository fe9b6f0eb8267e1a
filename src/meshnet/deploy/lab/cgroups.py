"""Memory caps and CPU pinning for lab nodes, on cgroup v1 or on the unified v2 hierarchy.

Which layout a host has is decided once, by ``detect_layout``, from the files the kernel shows:

- v1 (separate hierarchies, as on hybrid hosts): ``/sys/fs/cgroup/memory/<group>`` with
  ``memory.limit_in_bytes`` / ``memory.max_usage_in_bytes`` / ``memory.oom_control``, and
  ``/sys/fs/cgroup/cpuset/<group>`` with ``cpuset.cpus``; a process joins both.
- v2 (unified): one directory ``/sys/fs/cgroup/<group>`` with ``memory.max``, ``memory.peak``
  (``memory.current`` before Linux 5.19), ``memory.events`` and ``cpuset.cpus``; the
  controllers must be enabled in each parent's ``cgroup.subtree_control``.

Everything here takes the hierarchy's root as a value, so the choices are tested on fake trees
of both layouts; only ``CGROUP_ROOT`` names the host's. A process joins its node's groups by
writing its own pid before it execs the component, so no Python runs between fork and exec in
the supervisor (see ``lab.py``).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from meshnet.deploy.lab.plan import PREFIX, LabNode, LabPlan, object_tag
from meshnet.deploy.lab.system import LabUnavailable, kill_pid

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "cpuset")
"""What the lab needs: a memory cap per node and a core per node."""


@dataclass(frozen=True)
class CgroupLayout:
    """Which cgroup hierarchy holds the lab's controllers on this host, and where."""

    version: Literal[1, 2]
    root: Path

    @property
    def lab_roots(self) -> tuple[Path, ...]:
        """The directories the lab's groups are made in: one per controller on v1, one on v2."""
        if self.version == 1:
            return tuple(self.root / controller for controller in CONTROLLERS)
        return (self.root,)

    def directories(self, name: str) -> tuple[Path, ...]:
        """The directories a process joins for the group ``name`` (the memory group first)."""
        return tuple(top / name for top in self.lab_roots)

    def memory_limit_file(self, name: str) -> Path:
        """The file that holds the group's memory cap, in bytes."""
        return self.directories(name)[0] / ("memory.limit_in_bytes" if self.version == 1 else "memory.max")


def detect_layout(root: Path = CGROUP_ROOT) -> CgroupLayout:
    """v1 where the memory and cpuset controllers are mounted as v1 hierarchies under ``root``,
    else the unified v2 hierarchy at ``root`` if it offers both; else ``LabUnavailable`` saying
    what is missing (the lab cannot cap memory without them)."""
    if (root / "memory" / "memory.limit_in_bytes").exists() and (root / "cpuset" / "cpuset.cpus").exists():
        return CgroupLayout(1, root)
    controllers = root / "cgroup.controllers"
    if not controllers.exists():
        raise LabUnavailable(
            f"the lab needs cgroups: no cgroup v1 memory and cpuset hierarchies under {root} "
            f"and no cgroup v2 hierarchy at {root}"
        )
    missing = [name for name in CONTROLLERS if name not in controllers.read_text().split()]
    if missing:
        raise LabUnavailable(
            f"the cgroup v2 hierarchy at {root} does not offer the {' and '.join(missing)} controller "
            "the lab needs (enable it, or give the lab a delegated subtree that has it)"
        )
    return CgroupLayout(2, root)


def node_group_name(lab_cgroup: str, node_index: int, role: str) -> str:
    """The group of one role on one node, below the lab's own group (``mnlab-<tag>``)."""
    return f"{lab_cgroup}/n{node_index}-{role}"


@dataclass(frozen=True)
class NodeGroups:
    """The cgroup directories one node's processes join."""

    directories: tuple[Path, ...]

    def procs_files(self) -> tuple[Path, ...]:
        return tuple(directory / "cgroup.procs" for directory in self.directories)


def make_node_groups(
    plan: LabPlan, node: LabNode, *, role: str = "worker", layout: CgroupLayout | None = None
) -> NodeGroups:
    """The node's groups for one role: ``worker`` (and any other, such as a probe of the whole
    model under the same cap) gets the node's memory cap; ``control`` (the tracker and gateway
    of node 0) shares the node's core but not the cap, which is the memory a worker machine
    offers the model."""
    layout = layout or detect_layout()
    name = node_group_name(plan.cgroup, node.index, role)
    cap = node.memory_mb * 1024 * 1024 if role != "control" and node.memory_mb is not None else None
    try:
        if layout.version == 1:
            _make_v1(layout, name, node.cpu, cap)
        else:
            _make_v2(layout, name, node.cpu, cap)
    except OSError as error:
        where = f"{name} under {layout.root} (v{layout.version})"
        raise LabUnavailable(f"cannot set up the lab's cgroup {where}: {error}") from error
    return NodeGroups(layout.directories(name))


def _make_v1(layout: CgroupLayout, name: str, cpu: int, cap: int | None) -> None:
    memory, cpuset = layout.directories(name)
    for directory in (memory.parent, memory, cpuset.parent, cpuset):
        directory.mkdir(exist_ok=True)
    cpuset_root = layout.root / "cpuset"
    for directory in (cpuset.parent, cpuset):
        # A v1 cpuset starts empty and refuses tasks until cpus and mems are set.
        (directory / "cpuset.mems").write_text(_read(cpuset_root / "cpuset.mems"))
    (cpuset.parent / "cpuset.cpus").write_text(_read(cpuset_root / "cpuset.cpus"))
    (cpuset / "cpuset.cpus").write_text(str(cpu))
    if cap is not None:
        (memory / "memory.limit_in_bytes").write_text(str(cap))


def _make_v2(layout: CgroupLayout, name: str, cpu: int, cap: int | None) -> None:
    (group,) = layout.directories(name)
    # A controller reaches a group only if every parent enables it for its children; the lab's
    # own group holds no process itself, as v2 requires of a parent with controllers enabled.
    _enable_controllers(layout.root)
    group.parent.mkdir(exist_ok=True)
    _enable_controllers(group.parent)
    group.mkdir(exist_ok=True)
    (group / "cpuset.cpus").write_text(str(cpu))
    if cap is not None:
        (group / "memory.max").write_text(str(cap))


def _enable_controllers(directory: Path) -> None:
    control = directory / "cgroup.subtree_control"
    enabled = control.read_text().split() if control.exists() else []
    wanted = [f"+{name}" for name in CONTROLLERS if name not in enabled]
    if wanted:
        control.write_text(" ".join(wanted))


def _read(path: Path) -> str:
    return path.read_text().strip()


PEAK_FILES = ("memory.max_usage_in_bytes", "memory.peak", "memory.current")
"""v1's high watermark, v2's (Linux 5.19+), and before that v2's usage now: a lower bound."""


def peak_memory_bytes(groups: NodeGroups) -> int:
    """The most memory the group's processes have held at once (0 if no group says)."""
    for directory in groups.directories:
        for name in PEAK_FILES:
            path = directory / name
            if path.exists():
                return int(path.read_text().strip())
    return 0


def oom_kills(groups: NodeGroups) -> int:
    """How often the kernel killed a process of this node for its memory cap
    (``oom_kill`` of v2's ``memory.events`` or v1's ``memory.oom_control``)."""
    for directory in groups.directories:
        for name in ("memory.events", "memory.oom_control"):
            path = directory / name
            if path.exists():
                return counter(path.read_text(), "oom_kill")
    return 0


def counter(text: str, key: str) -> int:
    """The value of ``key`` in a flat-keyed cgroup file (``key value`` per line); 0 if absent."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return int(parts[1])
    return 0


def group_tops(root: Path = CGROUP_ROOT) -> list[Path]:
    """Every lab's own group on this host, under either layout (``mnlab-<tag>`` directories)."""
    candidates = [root / controller for controller in CONTROLLERS] + [root]
    return [top for base in candidates if base.is_dir() for top in sorted(base.glob(f"{PREFIX}-*")) if top.is_dir()]


def object_tags(root: Path = CGROUP_ROOT) -> frozenset[str]:
    """The tags of every lab that has a cgroup on this host now."""
    return frozenset(tag for tag in (object_tag(top.name) for top in group_tops(root)) if tag is not None)


def remove_groups(tag: str, root: Path = CGROUP_ROOT) -> list[str]:
    """Kill what is still inside lab ``tag``'s cgroups, then remove them (children first)."""
    removed: list[str] = []
    for top in group_tops(root):
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
