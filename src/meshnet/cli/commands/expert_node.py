"""``meshnet worker --experts I/N``: one node of an expert-parallel group.

The node takes the worker's flags (``WorkerConfig``) and the worker's identity; what it reads of
them is its own typed config (``moe.config.ExpertNodeConfig``), built here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from meshnet.cli.commands.swarm import node_security
from meshnet.core.config_flags import config_from_arguments
from meshnet.core.errors import InvalidArgument
from meshnet.core.layers import LayerRange
from meshnet.core.swarm_options import SecurityOptions
from meshnet.moe.config import ExpertNodeConfig, ExpertPeer
from meshnet.moe.server import serve_expert_node
from meshnet.moe.shape import read_moe_shape
from meshnet.node.config import WorkerConfig


def expert_node_config(worker: WorkerConfig) -> ExpertNodeConfig:
    """What an expert node reads of its worker flags."""
    if worker.experts is None or worker.model is None:
        raise InvalidArgument("an expert node needs --experts I/N and --model")
    cache_mb = worker.expert_cache_mb
    return ExpertNodeConfig(
        ownership=worker.experts,
        peers=tuple(ExpertPeer.parse(entry) for entry in worker.expert_peers),
        model=worker.model,
        data_dir=worker.data_dir,
        llama=worker.llama_config(worker.max_sessions),
        host=worker.host,
        port=worker.port,
        tracker=worker.tracker,
        exchange_timeout_s=worker.expert_timeout,
        expert_cache_bytes=None if cache_mb is None else int(cache_mb * 1e6),
    )


def serve_expert_node_command(given: dict[str, object], args: argparse.Namespace) -> int:
    if "layer_choice" in given or "fake" in given:
        raise InvalidArgument("--experts serves the whole model: drop --layers and --fake")
    if given.get("model") is None:
        raise InvalidArgument("an expert node needs --model")
    layers = LayerRange(0, read_moe_shape(Path(str(given["model"]))).n_layers)
    config = expert_node_config(WorkerConfig(**given, layer_choice=layers, data_dir=args.data_dir))  # type: ignore[arg-type]
    # The same identity as a layer worker's; --insecure must keep its bind and its peers local.
    options = config_from_arguments(SecurityOptions, args)
    local = (config.host, *(peer.address for peer in config.peers), config.tracker)
    security = node_security(options, args.data_dir, "worker", local)

    def ready(address: str, checks: str) -> None:
        share = config.ownership.label
        print(f"meshnet expert node ready {address} experts={share} certified={checks.split()[0]}", flush=True)

    serve_expert_node(config, ready, security)
    return 0
