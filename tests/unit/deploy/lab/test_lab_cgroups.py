"""The lab's cgroup choices on both layouts, over fake hierarchies in tmp_path: which layout a
host has, which directories a node's processes join, which files carry the cap, the peak and
the OOM kills, and where a lab's leftovers are found.

A fake tree is only files: it cannot show that the kernel enforces a cap or counts a peak.
The real hierarchy of this host is exercised by tests/integration/test_lab.py (caps read back)
and tests/model/test_lab_real.py (a model OOM-killed under its cap, peaks under the cap).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from meshnet.deploy.lab import cgroups
from meshnet.deploy.lab.cgroups import CgroupLayout, NodeGroups, detect_layout, make_node_groups
from meshnet.deploy.lab.plan import LabPlan, LinkShape, plan_lab
from meshnet.deploy.lab.system import LabUnavailable

CAP_MB = 160


def v1_tree(root: Path) -> Path:
    """The v1 files the lab reads: a memory hierarchy and a cpuset hierarchy with two cores."""
    (root / "memory").mkdir(parents=True)
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (root / "cpuset").mkdir()
    (root / "cpuset" / "cpuset.cpus").write_text("0-1\n")
    (root / "cpuset" / "cpuset.mems").write_text("0\n")
    return root


def v2_tree(root: Path, controllers: str = "cpuset cpu io memory pids", enabled: str = "cpu memory") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text(enabled + "\n")
    return root


def lab_plan() -> LabPlan:
    return plan_lab("t1", 3, 0, [], link=LinkShape(), memory_mb=CAP_MB, cpus=2)


def test_the_layout_is_read_from_the_files_the_kernel_shows(tmp_path: Path) -> None:
    assert detect_layout(v1_tree(tmp_path / "v1")) == CgroupLayout(1, tmp_path / "v1")
    assert detect_layout(v2_tree(tmp_path / "v2")) == CgroupLayout(2, tmp_path / "v2")
    # A hybrid host: v1 controllers plus an empty v2 mount beside them; the caps live in v1.
    hybrid = v1_tree(tmp_path / "hybrid")
    v2_tree(hybrid / "unified", controllers="")
    assert detect_layout(hybrid).version == 1


def test_a_host_without_usable_cgroups_is_refused_saying_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "none").mkdir()
    with pytest.raises(LabUnavailable, match=r"no cgroup v1 memory and cpuset hierarchies .* no cgroup v2"):
        detect_layout(tmp_path / "none")
    with pytest.raises(LabUnavailable, match="does not offer the cpuset controller"):
        detect_layout(v2_tree(tmp_path / "v2", controllers="cpu io memory pids"))
    with pytest.raises(LabUnavailable, match="memory and cpuset controller"):
        detect_layout(v2_tree(tmp_path / "bare", controllers=""))


def test_v1_groups_cap_memory_and_pin_a_core_in_two_hierarchies(tmp_path: Path) -> None:
    layout = detect_layout(v1_tree(tmp_path))
    plan = lab_plan()
    groups = make_node_groups(plan, plan.nodes[1], layout=layout)
    memory, cpuset = tmp_path / "memory" / "mnlab-t1" / "n1-worker", tmp_path / "cpuset" / "mnlab-t1" / "n1-worker"
    assert groups.directories == (memory, cpuset)
    assert groups.procs_files() == (memory / "cgroup.procs", cpuset / "cgroup.procs")
    assert (memory / "memory.limit_in_bytes").read_text() == str(CAP_MB * 2**20)
    assert layout.memory_limit_file("mnlab-t1/n1-worker") == memory / "memory.limit_in_bytes"
    assert (cpuset / "cpuset.cpus").read_text() == str(plan.nodes[1].cpu)
    # An empty v1 cpuset refuses tasks: the lab's own group and the node's get the host's mems.
    assert (cpuset.parent / "cpuset.mems").read_text() == (cpuset / "cpuset.mems").read_text() == "0"
    assert (cpuset.parent / "cpuset.cpus").read_text() == "0-1"


def test_v2_groups_are_one_directory_with_the_controllers_enabled_above_it(tmp_path: Path) -> None:
    layout = detect_layout(v2_tree(tmp_path))
    plan = lab_plan()
    groups = make_node_groups(plan, plan.nodes[2], layout=layout)
    group = tmp_path / "mnlab-t1" / "n2-worker"
    assert groups.directories == (group,) and groups.procs_files() == (group / "cgroup.procs",)
    assert (group / "memory.max").read_text() == str(CAP_MB * 2**20)
    assert layout.memory_limit_file("mnlab-t1/n2-worker") == group / "memory.max"
    assert (group / "cpuset.cpus").read_text() == str(plan.nodes[2].cpu)
    # The root already enabled memory: only cpuset is asked for there; the lab's group asks both.
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpuset"
    assert (tmp_path / "mnlab-t1" / "cgroup.subtree_control").read_text() == "+memory +cpuset"


@pytest.mark.parametrize("version", [1, 2])
def test_the_control_group_shares_the_core_but_not_the_cap(tmp_path: Path, version: int) -> None:
    layout = detect_layout(v1_tree(tmp_path) if version == 1 else v2_tree(tmp_path))
    plan = lab_plan()
    groups = make_node_groups(plan, plan.nodes[0], role="control", layout=layout)
    assert not layout.memory_limit_file("mnlab-t1/n0-control").exists()
    assert (groups.directories[-1] / "cpuset.cpus").read_text() == str(plan.nodes[0].cpu)


def test_a_group_the_kernel_refuses_is_a_lab_unavailable_error(tmp_path: Path) -> None:
    layout = detect_layout(v2_tree(tmp_path))
    (tmp_path / "mnlab-t1").write_text("not a directory")  # any OSError the kernel could give
    plan = lab_plan()
    with pytest.raises(LabUnavailable, match="cannot set up the lab's cgroup mnlab-t1/n1-worker"):
        make_node_groups(plan, plan.nodes[1], layout=layout)


def group_with(tmp_path: Path, **files: str) -> NodeGroups:
    directory = tmp_path / "group"
    directory.mkdir(parents=True)
    for name, text in files.items():
        (directory / name.replace("_", ".", 1)).write_text(text)
    return NodeGroups((directory,))


@pytest.mark.parametrize(
    ("files", "peak"),
    [
        ({"memory_max_usage_in_bytes": "300\n", "memory_usage_in_bytes": "100\n"}, 300),  # v1
        ({"memory_peak": "400\n", "memory_current": "200\n"}, 400),  # v2, Linux 5.19+
        ({"memory_current": "200\n"}, 200),  # older v2: the usage now, a lower bound
        ({}, 0),
    ],
)
def test_the_peak_is_read_from_the_layouts_file(tmp_path: Path, files: dict[str, str], peak: int) -> None:
    assert cgroups.peak_memory_bytes(group_with(tmp_path, **files)) == peak


def test_oom_kills_are_counted_on_both_layouts(tmp_path: Path) -> None:
    v2 = group_with(tmp_path / "v2", memory_events="low 0\nhigh 0\nmax 9\noom 4\noom_kill 2\noom_group_kill 0\n")
    v1 = group_with(tmp_path / "v1", memory_oom_control="oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    assert (cgroups.oom_kills(v2), cgroups.oom_kills(v1)) == (2, 3)
    assert cgroups.oom_kills(group_with(tmp_path / "none")) == 0


@pytest.mark.parametrize("version", [1, 2])
def test_a_labs_groups_are_found_by_tag_on_either_layout(tmp_path: Path, version: int) -> None:
    layout = detect_layout(v1_tree(tmp_path) if version == 1 else v2_tree(tmp_path))
    for tag in ("t1", "t12"):
        plan = plan_lab(tag, 1, 0, [], link=LinkShape(), memory_mb=CAP_MB, cpus=2)
        make_node_groups(plan, plan.nodes[0], layout=layout)
    (tmp_path / "unrelated").mkdir()
    assert cgroups.object_tags(tmp_path) == {"t1", "t12"}
    tops = cgroups.group_tops(tmp_path)
    assert tops == [top / f"mnlab-{tag}" for top in layout.lab_roots for tag in ("t1", "t12")]
