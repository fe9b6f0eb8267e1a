"""Launch specs for a local expert-parallel group: N ``meshnet worker --experts I/N`` processes.

Used by `meshnet up`, tests, the expert-parallel benchmark and anything else that starts a group
on one machine: it picks free loopback ports (the peers must know each other's addresses before
any starts), optionally pins node I to core I, and reads a node's resident model pages. Every
node runs the caller's ``WorkerConfig`` (``expert_node`` gives node 0's, whose ``experts`` names
the group's size) with its own share, peers and port. Each node's identity comes from the caller
(this layer holds no keys): an ``--identity`` and its node id for mTLS (the peers are then listed
as ``NODE_ID@HOST:PORT``, so each link is pinned to its node), or ``--insecure`` (plaintext,
loopback) when none is given.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from meshnet.core.errors import InvalidArgument
from meshnet.core.layers import LayerRange
from meshnet.core.swarm_options import SecurityOptions
from meshnet.deploy.launch.commands import INSECURE, worker_command
from meshnet.deploy.launch.ready_lines import ExpertNodeLine
from meshnet.moe.ownership import ExpertOwnership
from meshnet.moe.shape import read_moe_shape
from meshnet.node.config import LayerChoice, WorkerConfig
from meshnet.process.launcher import LaunchSpec


@dataclass(frozen=True)
class NodeIdentity:
    """How one node proves who it is: its identity options, and the node id its certificate names."""

    security: SecurityOptions
    node_id: str | None = None


def free_loopback_port() -> int:
    """A port free on 127.0.0.1 now (another process could take it before it is bound)."""
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def expert_node(data_dir: Path, model: Path, size: int) -> WorkerConfig:
    """Node 0 of a ``size``-node group over ``model`` with every other setting at its default;
    callers ``replace`` what they set (threads, context, ...) and hand it to ``expert_group_specs``."""
    whole = LayerChoice(LayerRange(0, read_moe_shape(model).n_layers))  # a node serves the whole backbone
    return WorkerConfig(model=model, layer_choice=whole, data_dir=data_dir, experts=ExpertOwnership(0, size))


def expert_group_specs(
    node: WorkerConfig,
    log_dir: Path,
    *,
    pin_cores: bool = False,
    identity: Callable[[str], NodeIdentity] | None = None,
) -> tuple[list[str], list[LaunchSpec]]:
    """Peer addresses in index order and one launch spec per node of ``node``'s group.

    ``identity(name)``: node ``name``'s (``expert-N-I``) swarm identity; None runs the group
    with ``--insecure``."""
    if node.experts is None:
        raise InvalidArgument("expert_group_specs needs a node of a group (experts=I/N), e.g. from expert_node")
    size = node.experts.count
    peers = [f"127.0.0.1:{free_loopback_port()}" for _ in range(size)]
    names = [f"expert-{size}-{index}" for index in range(size)]
    identities = [NodeIdentity(INSECURE) if identity is None else identity(name) for name in names]
    listed = tuple(f"{i.node_id}@{p}" if i.node_id else p for i, p in zip(identities, peers, strict=True))
    specs = []
    for index, name in enumerate(names):
        share = replace(node, experts=ExpertOwnership(index, size), expert_peers=listed, port=_port(peers[index]))
        command = worker_command(share, identities[index].security)
        if pin_cores:
            command = ("taskset", "-c", str(index % (os.cpu_count() or 1)), *command)
        specs.append(LaunchSpec(name, command, log_dir / f"{name}.log", ExpertNodeLine.PREFIX))
    return peers, specs


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


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
