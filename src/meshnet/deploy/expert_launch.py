"""Launch specs for a local expert-parallel group: N ``meshnet worker --experts I/N`` processes.

Used by tests, the expert-parallel benchmark and anything else that starts a group on one
machine: it picks free loopback ports (the peers must know each other's addresses before any
starts), optionally pins node I to core I, and reads a node's resident model pages. Each node's
identity comes from the caller (this layer holds no keys): ``--identity DIR`` and its node id for
mTLS (the peers are then listed as ``NODE_ID@HOST:PORT``, so each link is pinned to its node), or
``--insecure`` (plaintext, loopback) when none is given.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from meshnet.process.launcher import LaunchSpec, meshnet_command

EXPERT_READY_PREFIX = "meshnet expert node ready"


@dataclass(frozen=True)
class NodeIdentity:
    """How one node proves who it is: its identity flags, and the node id its certificate names."""

    flags: tuple[str, ...]
    node_id: str | None = None


INSECURE = NodeIdentity(("--insecure",))


def free_loopback_port() -> int:
    """A port free on 127.0.0.1 now (another process could take it before it is bound)."""
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def expert_group_specs(
    data_dir: Path,
    model: Path,
    size: int,
    log_dir: Path,
    options: Sequence[str] = (),
    *,
    pin_cores: bool = False,
    identity: Callable[[str], NodeIdentity] | None = None,
) -> tuple[list[str], list[LaunchSpec]]:
    """Peer addresses in index order and one launch spec per node (``options``: extra worker flags).

    ``identity(name)``: node ``name``'s (``expert-N-I``) swarm identity; None runs the group
    with ``--insecure``."""
    peers = [f"127.0.0.1:{free_loopback_port()}" for _ in range(size)]
    names = [f"expert-{size}-{index}" for index in range(size)]
    identities = [INSECURE if identity is None else identity(name) for name in names]
    listed = ",".join(f"{i.node_id}@{p}" if i.node_id else p for i, p in zip(identities, peers, strict=True))
    specs = []
    for index, name in enumerate(names):
        arguments = ["worker", "--model", str(model), "--experts", f"{index}/{size}", "--expert-peers", listed]
        arguments += ["--port", peers[index].split(":")[1], *options, *identities[index].flags]
        command = meshnet_command(data_dir, *arguments)
        if pin_cores:
            command = ("taskset", "-c", str(index % (os.cpu_count() or 1)), *command)
        specs.append(LaunchSpec(name, command, log_dir / f"{name}.log", EXPERT_READY_PREFIX))
    return peers, specs


def model_mapping_rss(pid: int) -> int:
    """Resident bytes of the GGUF files process ``pid`` has mapped (Linux /proc; 0 elsewhere)."""
    smaps = Path(f"/proc/{pid}/smaps")
    if not smaps.exists():
        return 0
    total, current = 0, ""
    for line in smaps.read_text().splitlines():
        parts = line.split()
        if "-" in parts[0] and len(parts) >= 5:
            current = parts[5] if len(parts) > 5 else ""
        elif parts[0] == "Rss:" and current.endswith(".gguf"):
            total += int(parts[1]) * 1024
    return total
