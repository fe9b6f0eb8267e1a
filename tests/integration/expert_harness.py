"""Helpers for tests of networked expert-parallel groups.

Swarm identities minted from a data dir's CA, as ``meshnet up`` does: every node a worker
certificate (``--identity``), every caller the certificate of the role it plays; another data
dir is another swarm (another CA). And the bitwise comparison of a group with the whole model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from meshnet.engine.backend import Backend, StepInput
from meshnet.process.expert_launch import expert_group_specs
from meshnet.process.launcher import ChildProcess, launch_all
from meshnet.protocol.tls import LinkSecurity
from meshnet.security.identity import Role
from meshnet.security.swarm_dir import load_identity, local_identity


def node_identity_flags(data_dir: Path) -> Callable[[str], tuple[str, ...]]:
    """``identity_flags`` for ``expert_group_specs``: a worker identity per node name."""
    return lambda name: ("--identity", str(local_identity(data_dir, name, "worker", time.time())))


def swarm_security(data_dir: Path, name: str, role: Role) -> LinkSecurity:
    """A caller's identity named ``name`` with ``role``, from ``data_dir``'s swarm (created if none)."""
    return LinkSecurity(load_identity(local_identity(data_dir, name, role, time.time())))


def launch_secure_group(
    root: Path, model: Path, size: int, options: Sequence[str]
) -> tuple[list[str], list[ChildProcess], LinkSecurity]:
    """Start ``size`` nodes with worker identities of ``root/data``'s swarm; their addresses, the
    processes (the caller stops them) and a gateway identity to drive them with."""
    data = root / "data"
    peers, specs = expert_group_specs(data, model, size, root, options, identity_flags=node_identity_flags(data))
    assert all("--identity" in spec.command and "--insecure" not in spec.command for spec in specs)
    children = launch_all(specs, timeout_s=240)
    return peers, children, swarm_security(data, "driver", "gateway")


def decode_bitwise(
    whole: Backend, group: Backend, prompt: np.ndarray, steps: int, between: Callable[[int], None] = lambda _: None
) -> int:
    """Prefill ``prompt`` in slot 0, then greedy-decode on both: every logit of the group must
    equal the whole model's bit for bit over ``steps`` steps (``between(step)`` runs after each).
    Returns the next position of the session."""
    batch = [StepInput(0, 0, tokens=prompt, want_logits="all")]
    position = len(prompt)
    for step in range(steps):
        want, got = whole.run(batch)[0].logits, group.run(batch)[0].logits
        assert want is not None and got is not None
        assert np.array_equal(want.view(np.uint32), got.view(np.uint32)), f"step {step} differs"
        batch = [StepInput(0, position, tokens=np.array([int(np.argmax(want[-1]))], np.int32))]
        position += 1
        between(step)
    return position - 1  # the last batch built above was not run
