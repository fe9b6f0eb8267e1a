"""Start a real meshnet swarm inside a built lab: tracker and gateway on node 0, a worker per node.

Workers bind their node's own address (never loopback) and advertise the node's relay, so every
byte between nodes crosses a shaped link with its delay.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshnet.core.layers import LayerRange, split_evenly
from meshnet.lab.lab import (
    GATEWAY_PORT,
    RUNTIME_OVERHEAD_MB,
    TRACKER_PORT,
    WORKER_PORT,
    Lab,
    _meshnet,
)
from meshnet.lab.plan import LabNode


@dataclass(frozen=True)
class LabSwarm:
    gateway_url: str
    tracker: str
    ranges: dict[int, LayerRange]
    """Node index -> the layers its worker serves (spares repeat a serving node's range)."""
    advertised: dict[int, str]


def choose_ranges(n_layers: int, serving: int, spares: int, given: tuple[LayerRange, ...]) -> list[LayerRange]:
    """Layers per node: the given ranges, or an even split; spare j covers serving node (1+j) mod N,
    so the first spare stands in for the middle of a 3-node route."""
    ranges = list(given) if given else split_evenly(n_layers, serving)
    return ranges + [ranges[(1 + j) % serving] for j in range(spares)]


def start_swarm(lab: Lab, n_layers: int) -> LabSwarm:
    plan = lab.plan
    if plan is None:
        raise RuntimeError("build the lab before starting a swarm")
    head = plan.nodes[0]
    tracker = f"{head.address}:{TRACKER_PORT}"
    lab.start(
        head,
        "tracker",
        _meshnet(
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
    ranges = choose_ranges(n_layers, len(plan.serving()), len(plan.spares()), lab.config.ranges)
    advertised = {}
    for node, layers in zip(plan.nodes, ranges, strict=True):
        advertised[node.index] = _start_worker(lab, node, layers, tracker)
    lab.start(
        head,
        "gateway",
        _meshnet(
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
        ),
        "meshnet gateway ready",
        role="control",
    )
    return LabSwarm(
        gateway_url=f"http://{head.address}:{GATEWAY_PORT}",
        tracker=tracker,
        ranges={node.index: layers for node, layers in zip(plan.nodes, ranges, strict=True)},
        advertised=advertised,
    )


def _start_worker(lab: Lab, node: LabNode, layers: LayerRange, tracker: str) -> str:
    address = lab.start_relay(node)
    budget = [] if node.memory_mb is None else ["--memory-budget-mb", str(node.memory_mb - RUNTIME_OVERHEAD_MB)]
    lab.start(
        node,
        f"worker-n{node.index}",
        _meshnet(
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
            *budget,
            *_name(lab),
        ),
        "meshnet worker ready",
    )
    return address


def _name(lab: Lab) -> list[str]:
    return ["--model-name", lab.config.model_name] if lab.config.model_name else []
