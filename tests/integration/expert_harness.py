"""Swarm identities for expert-parallel groups started by tests, minted from a data dir's CA.

As ``meshnet up`` does: every node a worker certificate (``--identity``), every caller the
certificate of the role it plays; another data dir is another swarm (another CA).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from meshnet.protocol.tls import LinkSecurity
from meshnet.security.identity import Role
from meshnet.security.swarm_dir import load_identity, local_identity


def node_identity_flags(data_dir: Path) -> Callable[[str], tuple[str, ...]]:
    """``identity_flags`` for ``expert_group_specs``: a worker identity per node name."""
    return lambda name: ("--identity", str(local_identity(data_dir, name, "worker", time.time())))


def swarm_security(data_dir: Path, name: str, role: Role) -> LinkSecurity:
    """A caller's identity named ``name`` with ``role``, from ``data_dir``'s swarm (created if none)."""
    return LinkSecurity(load_identity(local_identity(data_dir, name, role, time.time())))
