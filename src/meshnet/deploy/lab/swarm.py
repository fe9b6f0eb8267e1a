"""Start a real meshnet swarm inside a built lab: tracker and gateway on node 0, a worker per node,
a ``meshnet relay`` per relay node.

Workers bind their node's own address (never loopback) and advertise the node's delay line, so every
byte between nodes crosses a shaped link with its delay. A private node's worker binds its home
address behind its NAT router, attaches to the relays (in order) and registers ``NODE@RELAY``.
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from meshnet.artifact.describe import describe_model
from meshnet.artifact.manifest_codec import decode_manifest
from meshnet.artifact.model_id import served_model_id
from meshnet.artifact.publish import MANIFEST_NAME
from meshnet.core.addresses import is_relayed
from meshnet.core.errors import InvalidArgument, Unavailable
from meshnet.core.layer_costs import WorkerLoad
from meshnet.core.layers import LayerRange, split_evenly
from meshnet.core.swarm_options import SecurityOptions
from meshnet.deploy.lab.lab import (
    GATEWAY_PORT,
    READY_TIMEOUT_S,
    RELAY_PORT,
    SEED_PORT,
    TRACKER_PORT,
    WORKER_PORT,
    Lab,
    LabConfig,
)
from meshnet.deploy.lab.plan import LabNode
from meshnet.deploy.launch.commands import (
    gateway_command,
    minted_identity,
    relay_command,
    seed_command,
    tracker_launch,
    worker_command,
)
from meshnet.deploy.launch.ready_lines import GatewayLine, RegisteredLine, RelayServerLine, SeedLine, TrackerLine
from meshnet.gateway.config import GatewayConfig, GatewayProcessConfig
from meshnet.gateway.keys import ensure_client_key
from meshnet.membership.tracker_client import TrackerClient
from meshnet.node.artifact_server import SeedConfig
from meshnet.node.auto_layers import model_costs
from meshnet.node.config import LayerChoice, WorkerConfig
from meshnet.relay.config import RelayConfig
from meshnet.security.identity import Role
from meshnet.security.swarm_dir import load_identity, local_identity
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.placement import plan_ranges
from meshnet.wire.tls import LinkSecurity


@dataclass(frozen=True)
class LabSwarm:
    gateway_url: str
    tracker: str
    ranges: dict[int, LayerRange]
    """Node index -> the layers its worker serves (spares repeat a serving node's range)."""
    advertised: dict[int, str]
    """Node index -> where peers reach its worker (``NODE@RELAY`` for a private node, as first
    registered)."""
    api_key_path: Path
    """The client API key the gateway accepts (its data dir's ``api-key``, mode 0600)."""
    node_ids: dict[int, str] = field(default_factory=dict)
    """Node index -> its worker's node id."""
    relays: dict[int, str] = field(default_factory=dict)
    """Relay node index -> the address its relay is reached at (through the node's delay line)."""


def served_name(config: LabConfig) -> str:
    """The one name the lab's gateway, workers and sweep use: --model-name, else the published
    manifest's model id (workers fetching by it serve under it), else the file's stem."""
    published = None
    if config.published is not None:
        published = decode_manifest((config.published / MANIFEST_NAME).read_bytes()).model_id
    return served_model_id(config.model, config.model_name or published)


def choose_ranges(serving: list[LayerRange], spares: int) -> list[LayerRange]:
    """Spare j covers serving node (1+j) mod N, so the first spare stands in for the middle of a
    3-node route."""
    return serving + [serving[(1 + j) % len(serving)] for j in range(spares)]


def fixed_ranges(config: LabConfig, n_nodes: int) -> list[LayerRange] | None:
    """The configured ranges, else an even split for uncapped nodes; None: workers ask the
    tracker (``--layers auto``) within ``auto_budget_mb``."""
    if config.ranges:
        return list(config.ranges)
    if config.memory_mb is None:
        return split_evenly(describe_model(config.model).n_layers, n_nodes)
    return None


def auto_budget_mb(config: LabConfig, n_nodes: int) -> int:
    """The budget each ``--layers auto`` worker asks with: what the fullest node of the balanced
    split needs (never above the cap). Asking with the whole cap would let the first workers
    fill up and leave the last with nothing new to serve; with this budget, each worker in turn
    takes the next range and the N nodes cover the model as the balanced plan does."""
    if config.memory_mb is None:
        raise InvalidArgument("--layers auto in the lab needs a memory cap to budget from")
    # The workers' own cost model: their sessions and context, the worker's default prefill chunk.
    costs = model_costs(config.model, WorkerLoad(config.sessions, config.context, WorkerConfig.prefill_chunk))
    ranges = plan_ranges(costs, [config.memory_mb * 2**20] * n_nodes)
    need = max(costs.range_bytes(layers) for layers in ranges)
    return min(config.memory_mb, -(-need // 2**20))


def start_tracker(lab: Lab) -> str:
    """Start node 0's tracker (its database in node 0's data dir) and return its address."""
    if lab.plan is None:
        raise Unavailable("the lab's network is not built")
    head = lab.plan.nodes[0]
    config = TrackerConfig(host=head.address, port=TRACKER_PORT, heartbeat_interval_s=1.0)
    launch = tracker_launch(config, lab.node_data_dir(head))
    lab.start(head, "tracker", launch.argv, TrackerLine.PREFIX, role="control", environment=launch.environment)
    return f"{head.address}:{TRACKER_PORT}"


def restart_tracker(lab: Lab) -> str:
    """Kill node 0's tracker outright (SIGKILL, no shutdown) and start it again on its database."""
    old = next(c for c in lab.components if c.name == "tracker" and c.alive)
    old.send_signal(signal.SIGKILL)
    old.wait_exit(10.0)
    lab.components.remove(old)
    return start_tracker(lab)


def start_swarm(lab: Lab) -> LabSwarm:
    plan = lab.plan
    if plan is None:
        raise RuntimeError("build the lab before starting a swarm")
    head = plan.nodes[0]
    tracker = start_tracker(lab)
    serving, spares = plan.serving(), plan.spares()
    fixed = fixed_ranges(lab.config, len(serving))
    if fixed is None and lab.config.published is not None:
        raise InvalidArgument("workers fetching by model id cannot choose layers for a cap: give --ranges")
    model_id = None if lab.config.published is None else start_seeder(lab, tracker)
    budget = None if fixed is not None else auto_budget_mb(lab.config, len(serving))
    relays = start_relays(lab, tracker)
    attach_to = tuple(relays.values())
    workers: dict[int, tuple[str, str]] = {}
    chosen = []
    for position, node in enumerate(serving):
        layers = fixed[position] if fixed is not None else None
        workers[node.index], served = _start_worker(lab, node, layers, tracker, budget, model_id, attach_to)
        chosen.append(served)
    ranges = choose_ranges(chosen, len(spares))
    for node, layers in zip(spares, ranges[len(serving) :], strict=True):
        # Spares get the range they stand in for, so which node they back is fixed (the middle).
        workers[node.index], _ = _start_worker(lab, node, layers, tracker, None, model_id, attach_to)
    api_key_path = ensure_client_key(lab.node_data_dir(head))
    gateway = GatewayProcessConfig(
        tracker=tracker,
        model=lab.config.model,
        http=GatewayConfig(host=head.address, port=GATEWAY_PORT),
        data_dir=lab.node_data_dir(head),
        model_name=served_name(lab.config),
    )
    command = gateway_command(gateway, _identity(lab, "gateway", "gateway"))
    lab.start(head, "gateway", command, GatewayLine.PREFIX, role="control")
    return LabSwarm(
        gateway_url=f"http://{head.address}:{GATEWAY_PORT}",
        tracker=tracker,
        ranges={node.index: layers for node, layers in zip(plan.workers(), ranges, strict=True)},
        advertised={index: address for index, (_, address) in workers.items()},
        api_key_path=api_key_path,
        node_ids={index: node_id for index, (node_id, _) in workers.items()},
        relays=relays,
    )


def start_relays(lab: Lab, tracker: str) -> dict[int, str]:
    """Start each relay node's ``meshnet relay`` (behind the node's delay line, as a worker is;
    following ``tracker``'s revocations): relay node index -> the address private nodes attach
    to and dialers reach them through."""
    if lab.plan is None:
        raise Unavailable("the lab's network is not built")
    advertised = {}
    for node in lab.plan.relays():
        name = f"relay-n{node.index}"
        address = lab.start_delay_line(node, RELAY_PORT, role="relay")
        capture = None if lab.config.capture_dir is None else lab.config.capture_dir / name
        listen = f"{node.address}:{RELAY_PORT}"
        config = RelayConfig(listen=listen, advertise=address, tracker=tracker, capture_dir=capture)
        command = relay_command(config, lab.node_data_dir(node), _identity(lab, name, "relay"))
        lab.start(node, name, command, RelayServerLine.PREFIX, role="relay")
        advertised[node.index] = address
    return advertised


async def _listed_address(client: TrackerClient, node_id: str) -> str | None:
    table = await client.list_nodes()
    return next((node.record.address for node in table.nodes if node.node_id == node_id), None)


def registered_address(lab: Lab, tracker: str, node_id: str) -> str | None:
    """Where the tracker lists ``node_id`` now (a private node's moves with its relay); None if unlisted."""

    async def listed() -> str | None:
        async with TrackerClient(tracker, timeout_s=5.0, security=admin_security(lab, "lab-address")) as client:
            return await _listed_address(client, node_id)

    return asyncio.run(listed())


def await_relayed(lab: Lab, tracker: str, node_id: str, timeout_s: float = READY_TIMEOUT_S) -> str:
    """The ``NODE@RELAY`` address a private node is registered at, once it is: its first
    registration (its ready line) names its home address, private; it re-registers relayed as
    soon as a relay has taken it."""

    async def relayed() -> str:
        deadline = time.monotonic() + timeout_s
        async with TrackerClient(tracker, timeout_s=5.0, security=admin_security(lab, "lab-address")) as client:
            while not is_relayed(address := await _listed_address(client, node_id) or ""):
                if time.monotonic() > deadline:
                    raise Unavailable(f"private node {node_id} never registered through a relay (at {address!r})")
                await asyncio.sleep(0.1)
        return address

    return asyncio.run(relayed())


def start_seeder(lab: Lab, tracker: str, timeout_s: float = 30.0) -> str:
    """Seed ``published`` from node 0 and wait until the tracker names it a holder; returns the
    manifest's model id (what each worker fetches its range by)."""
    if lab.plan is None or lab.config.published is None:
        raise Unavailable("the lab's network is not built or has nothing published")
    head = lab.plan.nodes[0]
    model_id = decode_manifest((lab.config.published / MANIFEST_NAME).read_bytes()).model_id
    config = SeedConfig(lab.config.published, tracker=tracker, host=head.address, port=SEED_PORT)
    command = seed_command(config, lab.node_data_dir(head) / "seed", _identity(lab, "seed", "worker"))
    lab.start(head, "seed", command, SeedLine.PREFIX, role="control")

    async def announced() -> None:
        # Announcing runs after the seeder is ready; a worker asking before would find no holder.
        client = TrackerClient(tracker, security=admin_security(lab, "lab-seed-check"))
        try:
            deadline = time.monotonic() + timeout_s
            while not (await client.find_holders(model_id)).holders:
                if time.monotonic() > deadline:
                    raise Unavailable(f"the lab's seeder never announced {model_id}")
                await asyncio.sleep(0.1)
        finally:
            await client.close()

    asyncio.run(announced())
    return model_id


def _start_worker(
    lab: Lab,
    node: LabNode,
    layers: LayerRange | None,
    tracker: str,
    budget_mb: int | None,
    model_id: str | None = None,
    relays: tuple[str, ...] = (),
) -> tuple[tuple[str, str], LayerRange]:
    """Start the node's worker (``layers`` None: ``--layers auto`` within ``budget_mb``) and wait
    until the tracker has registered it, so the next auto worker counts its range. With
    ``model_id`` it fetches its range from the lab's seeder instead of cutting it from --model.
    A private node's worker attaches to ``relays``. Returns ((node id, registered address), layers)."""
    # A private node's inbound link is its relay's: nobody dials its own address.
    address = f"{node.address}:{WORKER_PORT}" if node.private else lab.start_delay_line(node)
    worker = WorkerConfig(
        model=None if model_id is not None else lab.config.model,
        model_id=model_id,
        layer_choice=LayerChoice(layers),  # None: auto, within the budget
        memory_budget_mb=budget_mb if layers is None else None,
        data_dir=lab.node_data_dir(node),
        model_name=lab.config.model_name,
        host=node.address,
        port=WORKER_PORT,
        advertise=address,
        tracker=tracker,
        threads=lab.config.threads,
        n_ctx_per_session=lab.config.context,
        max_sessions=lab.config.sessions,
        reachability="private" if node.private else "auto",
        relay=relays if node.private else (),
    )
    name = f"worker-n{node.index}"
    child = lab.start(node, name, worker_command(worker, _identity(lab, name, "worker")), RegisteredLine.PREFIX)
    if child.ready is None:
        raise Unavailable(f"{name} never registered")
    registered = RegisteredLine.read(child.ready)
    if node.private:
        # Registered as NODE@RELAY by the relay it attached to: the tracker knows which.
        address = await_relayed(lab, tracker, registered.node_id)
    return (registered.node_id, address), registered.layers


def ca_dir(lab: Lab) -> Path:
    """Node 0's data dir: its tracker made the lab's swarm CA there."""
    if lab.plan is None:
        raise RuntimeError("build the lab before starting a swarm")
    return lab.node_data_dir(lab.plan.nodes[0])


def _identity(lab: Lab, name: str, role: Role) -> SecurityOptions:
    """Every lab link is mTLS (nodes bind non-loopback addresses): mint from the head's swarm CA."""
    return minted_identity(ca_dir(lab), name, role)


def admin_security(lab: Lab, name: str = "lab-admin") -> LinkSecurity:
    """An admin identity from the lab's swarm CA, for reading the workers' metrics over mTLS."""
    return LinkSecurity(load_identity(local_identity(ca_dir(lab), name, "admin", time.time())))


def client_auth(swarm: LabSwarm) -> dict[str, str]:
    """The header the lab's gateway wants on /v1 requests."""
    return {"Authorization": f"Bearer {swarm.api_key_path.read_text().strip()}"}
