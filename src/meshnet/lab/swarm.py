"""Start a real meshnet swarm inside a built lab: tracker and gateway on node 0, a worker per node.

Workers bind their node's own address (never loopback) and advertise the node's relay, so every
byte between nodes crosses a shaped link with its delay.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from meshnet.artifact.describe import describe_model
from meshnet.artifact.gguf_file import parse_gguf
from meshnet.core.layers import LayerRange, split_evenly
from meshnet.gateway.keys import ensure_client_key
from meshnet.lab.lab import (
    GATEWAY_PORT,
    RUNTIME_OVERHEAD_MB,
    TRACKER_PORT,
    WORKER_PORT,
    Lab,
    LabConfig,
)
from meshnet.lab.plan import LabNode
from meshnet.process.launcher import meshnet_command
from meshnet.security.identity import Role
from meshnet.security.swarm_dir import local_identity
from meshnet.session.admission import kv_bytes_per_session
from meshnet.tracker.placement import LayerCosts, plan_ranges


@dataclass(frozen=True)
class LabSwarm:
    gateway_url: str
    tracker: str
    ranges: dict[int, LayerRange]
    """Node index -> the layers its worker serves (spares repeat a serving node's range)."""
    advertised: dict[int, str]
    api_key_path: Path
    """The client API key the gateway accepts (its data dir's ``api-key``, mode 0600)."""


def choose_ranges(serving: list[LayerRange], spares: int) -> list[LayerRange]:
    """Spare j covers serving node (1+j) mod N, so the first spare stands in for the middle of a
    3-node route."""
    return serving + [serving[(1 + j) % len(serving)] for j in range(spares)]


def layer_costs(model: Path, sessions: int, context: int) -> LayerCosts:
    """What each layer, the head and the tail of ``model`` need resident, from its GGUF header."""
    gguf = parse_gguf(model)
    description = describe_model(model)
    blocks = [0] * description.n_layers
    tail = 0
    for tensor in gguf.tensors.values():
        if tensor.name.startswith("blk."):
            blocks[int(tensor.name.split(".")[1])] += tensor.nbytes
        elif tensor.name.startswith("output") or (
            tensor.name == "token_embd.weight" and "output.weight" not in gguf.tensors
        ):
            tail += tensor.nbytes  # output norm and LM head (the token table when they are tied)
    kv = kv_bytes_per_session(context, 1, description.n_embd, description.n_head, description.n_head_kv)
    return LayerCosts(
        block_bytes=tuple(blocks),
        kv_bytes_per_layer=kv * sessions,
        tail_bytes=tail,
        fixed_bytes=RUNTIME_OVERHEAD_MB * 2**20,
    )


def serving_ranges(config: LabConfig, n_nodes: int) -> list[LayerRange]:
    """The configured ranges, else a split chosen for the nodes' memory, else an even split."""
    if config.ranges:
        return list(config.ranges)
    if config.memory_mb is None:
        return split_evenly(describe_model(config.model).n_layers, n_nodes)
    costs = layer_costs(config.model, config.sessions, config.context)
    return plan_ranges(costs, [config.memory_mb * 2**20] * n_nodes)


def start_swarm(lab: Lab) -> LabSwarm:
    plan = lab.plan
    if plan is None:
        raise RuntimeError("build the lab before starting a swarm")
    head = plan.nodes[0]
    tracker = f"{head.address}:{TRACKER_PORT}"
    lab.start(
        head,
        "tracker",
        meshnet_command(
            lab.node_data_dir(head),
            "tracker",
            "--host",
            head.address,
            "--port",
            str(TRACKER_PORT),
            "--heartbeat-interval",
            "1",
        ),
        "meshnet tracker listening on",
        role="control",
    )
    ranges = choose_ranges(serving_ranges(lab.config, len(plan.serving())), len(plan.spares()))
    advertised = {}
    for node, layers in zip(plan.nodes, ranges, strict=True):
        advertised[node.index] = _start_worker(lab, node, layers, tracker)
    api_key_path = ensure_client_key(lab.node_data_dir(head))
    lab.start(
        head,
        "gateway",
        meshnet_command(
            lab.node_data_dir(head),
            "gateway",
            "--tracker",
            tracker,
            "--model",
            str(lab.config.model),
            "--host",
            head.address,
            "--port",
            str(GATEWAY_PORT),
            *_name(lab),
            *_identity(lab, "gateway", "gateway"),
        ),
        "meshnet gateway ready",
        role="control",
    )
    return LabSwarm(
        gateway_url=f"http://{head.address}:{GATEWAY_PORT}",
        tracker=tracker,
        ranges={node.index: layers for node, layers in zip(plan.nodes, ranges, strict=True)},
        advertised=advertised,
        api_key_path=api_key_path,
    )


def _start_worker(lab: Lab, node: LabNode, layers: LayerRange, tracker: str) -> str:
    address = lab.start_relay(node)
    lab.start(
        node,
        f"worker-n{node.index}",
        meshnet_command(
            lab.node_data_dir(node),
            "worker",
            "--model",
            str(lab.config.model),
            "--layers",
            str(layers),
            "--host",
            node.address,
            "--port",
            str(WORKER_PORT),
            "--advertise",
            address,
            "--tracker",
            tracker,
            "--threads",
            str(lab.config.threads),
            "--context",
            str(lab.config.context),
            "--max-sessions",
            str(lab.config.sessions),
            *_name(lab),
            *_identity(lab, f"worker-n{node.index}", "worker"),
        ),
        "meshnet worker ready",
    )
    return address


def _identity(lab: Lab, name: str, role: Role) -> list[str]:
    """Every lab link is mTLS (nodes bind non-loopback addresses): mint from the head's swarm CA."""
    if lab.plan is None:
        raise RuntimeError("build the lab before starting a swarm")
    ca_dir = lab.node_data_dir(lab.plan.nodes[0])
    return ["--identity", str(local_identity(ca_dir, name, role, time.time()))]


def _name(lab: Lab) -> list[str]:
    return ["--model-name", lab.config.model_name] if lab.config.model_name else []
