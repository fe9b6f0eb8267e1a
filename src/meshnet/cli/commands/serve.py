"""``meshnet worker | tracker | gateway``: the long-running components, each built from its config.

Each prints its ready line (``deploy.launch.ready_lines``) once it serves: `meshnet up`, the lab,
the bench and the tests launch these commands (``deploy.launch.commands``) and wait for it.
``worker_config``, ``tracker_config`` and ``gateway_config`` are the one way a parsed command
line becomes a config, so the launchers' argv is checked against exactly what runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from meshnet.cli.common import Command, provisioned_model
from meshnet.cli.flags import config_from_arguments, given_arguments
from meshnet.core.errors import InvalidArgument
from meshnet.core.layers import LayerRange

if TYPE_CHECKING:
    from meshnet.gateway.config import GatewayProcessConfig
    from meshnet.node.config import WorkerConfig
    from meshnet.tracker.config import TrackerConfig
    from meshnet.tracker.server import RunningTracker
    from meshnet.wire.tls import LinkSecurity


def worker_config(args: argparse.Namespace) -> WorkerConfig:
    """The worker's config from its flags: ``--model`` defaults to the provisioned model (unless a
    fake model or ``--model-id`` serves), an expert node or a group's front serves the whole model."""
    from meshnet.node.config import WorkerConfig

    given = given_arguments(WorkerConfig, args)
    if "model" not in given:
        given["model"] = None if "fake" in given or "model_id" in given else provisioned_model(args.data_dir)
    if "experts" in given:
        if "layer_choice" in given or "fake" in given:
            raise InvalidArgument("--experts serves the whole model: drop --layers and --fake")
        from meshnet.moe.shape import read_moe_shape

        given["layer_choice"] = LayerRange(0, read_moe_shape(Path(str(given["model"]))).n_layers)
    elif "expert_group" in given and "layer_choice" not in given and given["model"] is not None:
        from meshnet.artifact.describe import describe_model

        given["layer_choice"] = LayerRange(0, describe_model(Path(str(given["model"]))).n_layers)  # a group: all
    if "layer_choice" not in given:
        raise InvalidArgument("meshnet worker needs --layers A:B|auto (or --experts I/N for an expert-parallel node)")
    return WorkerConfig(**given, data_dir=args.data_dir)


def cmd_worker(args: argparse.Namespace) -> int:
    import asyncio

    from meshnet.core.tracking import Registered
    from meshnet.deploy.launch.ready_lines import RegisteredLine, WorkerLine, announce
    from meshnet.node.server import WorkerReady, serve_worker

    config = worker_config(args)
    if config.experts is not None:
        return _serve_expert_node(config, args)
    # The relays too: --insecure plaintext to a relay off this machine would carry the node's traffic.
    security = _security(args, "worker", (config.host, config.advertise, config.tracker, *config.relay))

    def ready(info: WorkerReady) -> None:
        metrics = f"http://{info.metrics_address}/metrics" if info.metrics_address else None
        announce(WorkerLine(info.address, info.node_id, info.fingerprint, metrics))
        layers.append(LayerRange.parse(info.layers))  # what ``--layers auto`` resolved to

    def registered(reply: Registered) -> None:
        # The lab starts `--layers auto` workers one by one on this line, so each sees the last.
        announce(RegisteredLine(reply.node_id, layers[-1], reply.epoch))

    layers: list[LayerRange] = []
    asyncio.run(serve_worker(config, on_ready=ready, on_registered=registered, security=security))
    return 0


def _serve_expert_node(worker: WorkerConfig, args: argparse.Namespace) -> int:
    from meshnet.cli.commands.expert_node import expert_node_config
    from meshnet.deploy.launch.ready_lines import ExpertNodeLine, announce
    from meshnet.moe.server import serve_expert_node

    config = expert_node_config(worker)
    # The same identity as a layer worker's; --insecure must keep its bind and its peers local.
    security = _security(args, "worker", (config.host, *(peer.address for peer in config.peers), config.tracker))

    def ready(address: str, checks: str) -> None:
        announce(ExpertNodeLine(address, config.ownership.label, checks.split()[0]))

    serve_expert_node(config, ready, security)
    return 0


def _security(args: argparse.Namespace, name: str, addresses: tuple[str | None, ...]) -> LinkSecurity | None:
    from meshnet.cli.commands.swarm import node_security
    from meshnet.core.swarm_options import SecurityOptions

    return node_security(config_from_arguments(SecurityOptions, args), args.data_dir, name, addresses)


def cmd_tracker(args: argparse.Namespace) -> int:
    from meshnet.deploy.launch.ready_lines import TrackerJoinLine, TrackerLine, announce
    from meshnet.tracker.server import run_tracker

    def ready(running: RunningTracker) -> None:
        # Scripts and tests wait for this line to learn the bound port.
        metrics = f"http://{running.metrics.address}/metrics" if running.metrics is not None else None
        announce(TrackerLine(running.address, metrics))
        if running.join_address is not None:
            announce(TrackerJoinLine(running.join_address))

    return run_tracker(tracker_config(args), args.data_dir, ready)


def tracker_config(args: argparse.Namespace) -> TrackerConfig:
    """The tracker's config from its flags; ``--db`` defaults to ``DATA_DIR/tracker.sqlite3``."""
    from meshnet.tracker.config import DEFAULT_DB_NAME, TrackerConfig

    return config_from_arguments(TrackerConfig, args, computed={"db_path": lambda: args.data_dir / DEFAULT_DB_NAME})


def gateway_config(args: argparse.Namespace) -> GatewayProcessConfig:
    """The gateway's config from its flags; ``--model`` defaults to the provisioned model unless
    ``--model-id`` serves a published one."""
    from meshnet.gateway.config import GatewayProcessConfig

    by_id = "model_id" in given_arguments(GatewayProcessConfig, args)
    computed = {} if by_id else {"model": lambda: provisioned_model(args.data_dir)}
    return config_from_arguments(GatewayProcessConfig, args, computed=computed, fixed={"data_dir": args.data_dir})


def cmd_gateway(args: argparse.Namespace) -> int:
    import asyncio

    from meshnet.deploy.launch.ready_lines import GatewayLine, announce
    from meshnet.gateway.main import run_gateway

    config = gateway_config(args)
    security = _security(args, "gateway", (config.tracker,))

    def ready(url: str, model: str) -> None:
        announce(GatewayLine(url, model))

    asyncio.run(run_gateway(config, on_ready=ready, security=security))
    return 0


def cmd_relay(args: argparse.Namespace) -> int:
    import asyncio

    from meshnet.cli.commands.relay import run_relay
    from meshnet.relay.config import RelayConfig

    config = config_from_arguments(RelayConfig, args)
    security = _security(args, "relay", (config.listen, config.advertise, config.tracker))
    asyncio.run(run_relay(config, security))
    return 0


def serve_commands() -> dict[str, Command]:
    # Imported here: building the parser must not import llama.cpp or grpc for every command.
    from meshnet.core.swarm_options import SecurityOptions
    from meshnet.gateway.config import GatewayProcessConfig
    from meshnet.node.config import WorkerConfig
    from meshnet.relay.config import RelayConfig
    from meshnet.tracker.config import TrackerConfig

    return {
        "worker": Command(cmd_worker, "serve one layer range of a model over gRPC", (WorkerConfig, SecurityOptions)),
        "tracker": Command(cmd_tracker, "register shards, choose routes, keep work records", (TrackerConfig,)),
        "gateway": Command(
            cmd_gateway,
            "OpenAI-compatible HTTP API over the swarm",
            (GatewayProcessConfig, SecurityOptions),
            skip=("data_dir",),
        ),
        "relay": Command(
            cmd_relay, "let nodes behind NAT be reached: splice end-to-end TLS", (RelayConfig, SecurityOptions)
        ),
    }
