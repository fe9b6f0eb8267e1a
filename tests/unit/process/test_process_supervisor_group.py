"""The supervisor restarts a group's children together, and a child outside the group alone.

Real child processes (a Python one-liner that prints its ready line and sleeps): an expert
group's node that dies takes its peers and its front down and up again with it, because none of
them can continue with a restarted node; a component outside the group keeps running.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from meshnet.process.launcher import LaunchSpec
from meshnet.process.supervisor import CrashLoop, RestartPolicy, Supervised, Supervisor

pytestmark = pytest.mark.timeout(60)
READY = "ready "


def _sleeper(root: Path, name: str, group: str | None = None) -> Supervised:
    command = (sys.executable, "-c", f"import time; print('{READY}{name}', flush=True); time.sleep(600)")
    return Supervised(LaunchSpec(name, command, root / f"{name}.log", READY), group=group)


def _pids(supervisor: Supervisor) -> dict[str, int]:
    return {c.name: c.child.pid for c in supervisor.components if c.child is not None}


def test_a_dead_member_restarts_its_whole_group_and_nothing_else(tmp_path: Path) -> None:
    events: list[tuple[str, str]] = []
    policy = RestartPolicy(max_restarts=1, delay_s=0.0, group_stop_grace_s=2.0)
    supervisor = Supervisor(30.0, policy, lambda component, event: events.append((component.name, event)))
    try:
        supervisor.start(
            [_sleeper(tmp_path, "solo"), *(_sleeper(tmp_path, n, "g") for n in ("node0", "node1", "front"))]
        )
        before = _pids(supervisor)
        node1 = next(c for c in supervisor.components if c.name == "node1")
        assert node1.child is not None
        node1.child.signal_group(signal.SIGKILL)
        node1.child.wait_exit(10.0)
        supervisor.restart_exited()
        after = _pids(supervisor)
        assert after["solo"] == before["solo"]
        assert all(after[name] != before[name] for name in ("node0", "node1", "front")), (before, after)
        assert {c.name: c.restarts for c in supervisor.components} == {"solo": 0, "node0": 1, "node1": 1, "front": 1}
        assert events[-4:] == [
            ("node1", "exited"),
            ("node0", "restarted"),
            ("node1", "restarted"),
            ("front", "restarted"),
        ]
        assert all(c.child is not None and c.child.alive for c in supervisor.components)
        # The member that keeps dying is a crash loop (its own restarts count, not the group's).
        node1.child.signal_group(signal.SIGKILL)
        node1.child.wait_exit(10.0)
        with pytest.raises(CrashLoop, match="node1"):
            supervisor.restart_exited()
    finally:
        supervisor.stop(2.0)
