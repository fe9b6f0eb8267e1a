"""`meshnet lab`: a home network on one machine.

N (+K spare) nodes, each a network namespace on a private bridge with its own address, a shaped
link (``tbf`` for bandwidth, a userspace delay line for delay), a memory cap and a pinned core.
Node 0 runs the tracker and the gateway; every node runs one worker bound to its own address.
Layers are chosen for each node's memory. With ``--private P``, P serving nodes (the middle ones
first) sit behind a NAT router namespace of their own and are reached only through the
``--relays`` nodes, public nodes that each run a ``meshnet relay``. Everything made is removed on
exit, and whatever a SIGKILLed lab left behind is removed by the next ``lab up`` or ``lab down``.
A running lab holds its tag (``claims.py``), so neither ever touches a live lab's objects.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from meshnet.core.config_flags import PROVISIONED_MODEL, cli
from meshnet.core.errors import Unavailable
from meshnet.core.layers import LayerRange
from meshnet.deploy.lab import cgroups, claims, system
from meshnet.deploy.lab.delay_line import delay_line_command
from meshnet.deploy.lab.plan import LabNode, LabPlan, LinkShape, check_tag, plan_lab
from meshnet.deploy.launch.ready_lines import DelayLine
from meshnet.process.launcher import ChildProcess, LaunchSpec, stop_all

log = logging.getLogger(__name__)

TRACKER_PORT = 7100
WORKER_PORT = 7000
DELAY_PORT = 7001
RELAY_PORT = 7300
"""Where a relay node's ``meshnet relay`` listens (peers reach it through its delay line, if any)."""
GATEWAY_PORT = 8080
SEED_PORT = 7200
READY_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class LabConfig:
    """``meshnet lab``: the nodes to make, their links and caps, and the swarm they run."""

    model: Path = field(metadata=cli(shown_default=PROVISIONED_MODEL))
    """Source GGUF every node's worker cuts its layers from."""
    data_dir: Path
    """Holds each node's own data dir and the lab's logs (the global --data-dir)."""
    nodes: int = 3
    """Serving nodes, one worker each; node 0 also runs the tracker and the gateway."""
    spares: int = 0
    """Extra nodes whose workers repeat a serving node's layers (the first covers the middle)."""
    private: int = 0
    """Serving nodes put behind a NAT router of their own (the middle ones first; never node 0),
    reached only through a relay."""
    relays: int | None = None
    """Public relay nodes, each running ``meshnet relay``; none: one when --private is given."""
    delay_ms: float = 0.0
    """One-way delay added to every node's inbound link (a userspace delay line; no netem here)."""
    bandwidth_mbit: float | None = None
    """Rate cap per direction of every node's link (tbf); None leaves links unshaped."""
    memory_mb: int | None = None
    """Memory cap per node (cgroup); None leaves nodes uncapped."""
    context: int = 2048
    """Positions per session on every worker."""
    sessions: int = 1
    """Sessions with KV each worker holds at once; the gateway queues the rest."""
    threads: int = 1
    """llama.cpp threads per worker (each node is pinned to one core)."""
    model_name: str | None = None
    """Name served to clients; none: the file's stem (``served_model_id``)."""
    tag: str = "lab"
    """Names this lab's namespaces, links and cgroups (1-6 letters or digits), so labs can coexist."""
    ranges: tuple[LayerRange, ...] = ()
    """Layers for each serving node; empty chooses them for each node's memory."""
    capture_dir: Path | None = None
    """Each relay node's ``meshnet relay --capture-dir``: DIR/relay-n<i> gets every spliced
    connection's bytes (tests read them to show the relay sees TLS records only)."""
    published: Path | None = None
    """A directory ``meshnet publish`` wrote from --model: node 0 seeds it and each worker fetches
    only its range by the manifest's model id instead of cutting it from --model (needs --ranges
    when nodes are capped); the gateway still reads its tokenizer from --model."""


def _enter_node(plan: LabPlan, node: LabNode, groups: cgroups.NodeGroups, argv: Sequence[str]) -> list[str]:
    """A command that joins the node's cgroups and namespace, then execs ``argv``.

    The shell writes its own pid into the cgroups before exec, so the supervisor forks and
    execs with no Python in between (fork-safe under gRPC threads).
    """
    joins = " && ".join(f'echo $$ > "{path}"' for path in groups.procs_files())
    script = f'{joins} && exec "$0" "$@"'
    return ["sh", "-c", script, "ip", "netns", "exec", node.namespace, *argv]


class Lab:
    """Builds the lab's network and groups, starts its components, and removes everything."""

    def __init__(self, config: LabConfig, claims_dir: Path = claims.CLAIMS_DIR) -> None:
        self.config = config
        self.claims_dir = claims_dir
        self.claim: claims.LabClaim | None = None
        """Held from ``build`` to ``close``: while it is, no other lab removes or reuses this tag."""
        self.plan: LabPlan | None = None
        self.groups: dict[tuple[int, str], cgroups.NodeGroups] = {}
        self.layout: cgroups.CgroupLayout | None = None
        """The host's cgroup hierarchy (v1 or v2), found before anything is built."""
        self.components: list[ChildProcess] = []
        self.logs = config.data_dir / "lab" / config.tag / "logs"

    # -- build and remove -------------------------------------------------------------------

    def build(self) -> LabPlan:
        system.check_privileges(private=self.config.private > 0)
        self.layout = cgroups.detect_layout()  # refused here, before half a lab exists
        config = self.config
        check_tag(config.tag)
        # Claim first: what carries this tag's names is then a dead lab's leftovers, never a live lab.
        self.claim = claims.claim(config.tag, self.claims_dir)
        _remove_objects(config.tag)
        with claims.building(self.claims_dir):
            self.plan = plan_lab(
                config.tag,
                config.nodes,
                config.spares,
                system.host_networks(),
                link=LinkShape(config.delay_ms, config.bandwidth_mbit),
                memory_mb=config.memory_mb,
                cpus=len(os.sched_getaffinity(0)),
                private=config.private,
                relays=relay_count(config),
            )
            system.build_network(self.plan)
        for node in self.plan.nodes:
            role = "relay" if node.relay else "worker"
            self.groups[node.index, role] = cgroups.make_node_groups(self.plan, node, role=role, layout=self.layout)
        head = self.plan.nodes[0]
        self.groups[head.index, "control"] = cgroups.make_node_groups(
            self.plan, head, role="control", layout=self.layout
        )
        self.logs.mkdir(parents=True, exist_ok=True)
        return self.plan

    def add_group(self, node: LabNode, role: str) -> cgroups.NodeGroups:
        """Another group on ``node`` with the node's cap, for a process apart from its worker."""
        if self.plan is None:
            raise Unavailable("the lab's network is not built")
        groups = cgroups.make_node_groups(self.plan, node, role=role, layout=self.layout)
        self.groups[node.index, role] = groups
        return groups

    def close(self) -> None:
        stop_all(list(reversed(self.components)))
        self.components.clear()
        if self.claim is None:
            return  # never built, or refused because another lab holds the tag: nothing here is ours
        try:
            _remove_objects(self.config.tag)
        finally:
            self.claim.release()
            self.claim = None

    # -- components ---------------------------------------------------------------------------

    def start(
        self,
        node: LabNode,
        name: str,
        argv: Sequence[str],
        ready_prefix: str,
        role: str = "worker",
        environment: Mapping[str, str] | None = None,
    ) -> ChildProcess:
        """Start ``argv`` inside the node (its namespace and cgroups) and wait for its ready line.

        The shared launcher gives it a lifeline, so it ends with the lab however the lab ends.
        """
        if self.plan is None:
            raise Unavailable("the lab's network is not built")
        command = tuple(_enter_node(self.plan, node, self.groups[node.index, role], argv))
        spec = LaunchSpec(name, command, self.logs / f"{name}.log", ready_prefix, dict(environment or {}))
        child = ChildProcess(spec)
        self.components.append(child)
        child.await_ready(time.monotonic() + READY_TIMEOUT_S)
        return child

    def node_data_dir(self, node: LabNode) -> Path:
        # Each node keeps its own slice cache and logs, as a separate machine would.
        return self.config.data_dir / "lab" / self.config.tag / f"n{node.index}"

    def start_delay_line(self, node: LabNode, port: int = WORKER_PORT, role: str = "worker") -> str:
        """The address peers use for what listens on the node's ``port``: through the node's
        delay line when there is one."""
        if self.config.delay_ms <= 0:
            return f"{node.address}:{port}"
        listen, target = f"{node.address}:{DELAY_PORT}", f"{node.address}:{port}"
        command = delay_line_command(listen, target, self.config.delay_ms)
        self.start(node, f"delay-n{node.index}", command, DelayLine.PREFIX, role=role)
        return f"{node.address}:{DELAY_PORT}"

    def worker_memory(self) -> dict[int, tuple[int, int]]:
        """Node index -> (peak bytes, OOM kills) of its worker's group."""
        return {
            index: (cgroups.peak_memory_bytes(groups), cgroups.oom_kills(groups))
            for (index, role), groups in self.groups.items()
            if role == "worker"
        }


def relay_count(config: LabConfig) -> int:
    """The relay nodes to make: as configured, else one when any node is private."""
    if config.relays is not None:
        return config.relays
    return 1 if config.private > 0 else 0


def remove_lab(tag: str | None = None, claims_dir: Path = claims.CLAIMS_DIR) -> list[str]:
    """Remove every namespace, link and cgroup of lab ``tag`` (or of every lab) that no live lab
    holds: a named tag in use raises ``LabInUse``; without a tag, live labs are left as they are.

    The removed tags are claimed while their objects go, so a lab starting meanwhile with one of
    them waits for nothing and loses nothing: it is refused (``LabInUse``) and may try again."""
    if tag is not None:
        try:
            held = [claims.claim(tag, claims_dir)]
        except claims.LabInUse:
            raise claims.LabInUse(f"lab {tag!r} is running; stop it (SIGTERM to its `lab up`) to remove it") from None
    else:
        held, _live = claims.claim_free(system.object_tags() | cgroups.object_tags(), claims_dir)
    try:
        return [item for claim in held for item in _remove_objects(claim.tag)]
    finally:
        for claim in held:
            claim.release()


def _remove_objects(tag: str) -> list[str]:
    """Remove lab ``tag``'s objects; the caller holds its claim."""
    return system.remove_leftovers(tag) + cgroups.remove_groups(tag)


def wait_forever(lab: Lab) -> None:
    """Serve until SIGTERM/SIGINT or until a component dies."""
    while all(component.alive for component in lab.components):
        time.sleep(0.5)
    dead = [component.name for component in lab.components if not component.alive]
    raise Unavailable(f"lab component(s) exited: {', '.join(dead)}")
