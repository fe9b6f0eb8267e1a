"""``meshnet up | lab``: a whole swarm on this machine, or in a namespaced multi-host lab.

``up`` hands its config to ``deploy.up``; ``lab up|down|sweep`` build a lab, run a swarm in it
and serve until SIGTERM, remove what labs left, or measure the network sweep (its plot is drawn
by the bench's plotting). What is printed for the operator is printed here.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from meshnet.cli.arguments import LabArguments
from meshnet.cli.common import Command, provisioned_model
from meshnet.cli.flags import config_from_arguments, given_arguments
from meshnet.core.errors import MeshnetError

if TYPE_CHECKING:
    from meshnet.deploy.lab.lab import LabConfig
    from meshnet.deploy.lab.plan import LabNode
    from meshnet.deploy.lab.swarm import LabSwarm


def cmd_up(args: argparse.Namespace) -> int:
    from meshnet.deploy.config import LocalSwarmConfig
    from meshnet.deploy.up import run_local_swarm

    given = given_arguments(LocalSwarmConfig, args)
    if "model" not in given:
        # Served under its file's stem, as a worker or gateway given the same file names it.
        given["model"] = provisioned_model(args.data_dir)
    return run_local_swarm(LocalSwarmConfig(**given, data_dir=args.data_dir))


def cmd_lab(args: argparse.Namespace) -> int:
    from meshnet.deploy.lab.lab import LabConfig

    given = given_arguments(LabConfig, args)
    arguments = config_from_arguments(LabArguments, args)
    if arguments.action == "down":
        return lab_down(given.get("tag"))
    if "model" not in given:
        given["model"] = provisioned_model(args.data_dir)
    if arguments.action == "sweep":
        return lab_sweep(LabConfig(**given, data_dir=args.data_dir), arguments)
    return lab_up(LabConfig(**given, data_dir=args.data_dir))


def _raise_on_sigterm() -> None:
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def lab_up(config: LabConfig) -> int:
    from meshnet.deploy.lab.lab import Lab, wait_forever
    from meshnet.deploy.lab.swarm import start_swarm

    _raise_on_sigterm()
    lab = Lab(config)
    try:
        plan = lab.build()
        print(f"lab       {plan.subnet} on bridge {plan.bridge} ({len(plan.nodes)} nodes)", flush=True)
        swarm = start_swarm(lab)
        for node in plan.nodes:
            print(_node_line(node, swarm), flush=True)
        print(f"api key   {swarm.api_key_path}", flush=True)
        print(f"gateway   {swarm.gateway_url}/v1", flush=True)
        wait_forever(lab)
        return 1
    except KeyboardInterrupt:
        return 0
    except MeshnetError as error:
        print(f"meshnet lab: [{error.code}] {error.message}", file=sys.stderr)
        return 2
    finally:
        lab.close()


def _node_line(node: LabNode, swarm: LabSwarm) -> str:
    """One node as the operator reads it: its role, namespace, address, core, cap and what it serves."""
    role = "relay" if node.relay else "spare" if node.spare else "private" if node.private else "node"
    cap = f"{node.memory_mb} MiB" if node.memory_mb else "uncapped"
    behind = f" behind NAT {node.router.public_address}" if node.router is not None else ""
    serves = "relay" if node.relay else f"layers {swarm.ranges[node.index]}"
    via = swarm.relays[node.index] if node.relay else swarm.advertised[node.index]
    return f"{role:9s} {node.namespace} {node.address}{behind} cpu {node.cpu} {cap} {serves} via {via}"


def lab_down(tag: str | None) -> int:
    from meshnet.deploy.lab.claims import claimed_tags
    from meshnet.deploy.lab.lab import remove_lab

    try:
        removed = remove_lab(tag)
    except MeshnetError as error:
        print(f"meshnet lab down: [{error.code}] {error.message}", file=sys.stderr)
        return 2
    print(f"removed {len(removed)} lab object(s)" + "".join(f"\n  {item}" for item in removed))
    if tag is None:
        for live in sorted(claimed_tags()):
            print(f"left running: lab {live!r} (stop its `lab up` to remove it)")
    return 0


def lab_sweep(config: LabConfig, arguments: LabArguments) -> int:
    """The network sweep (``sweep.py``): JSON at ``--sweep-output``, its plot beside it; with
    ``--private 1`` the relayed middle against the direct one (``relay_sweep.py``), JSON only."""
    from meshnet.artifact.describe import describe_model
    from meshnet.bench.plots import write_lab_sweep_plot
    from meshnet.deploy.lab.relay_sweep import run_relay_sweep
    from meshnet.deploy.lab.sweep import run_sweep

    delays, rates = arguments.sweep_delays_ms, arguments.sweep_rates_mbit
    relayed = config.private > 0
    default = "lab-sweep-relay.json" if relayed else "lab-sweep.json"
    output = arguments.sweep_output or Path("bench/results") / default
    try:
        n_embd = describe_model(config.model).n_embd
        if relayed:
            run_relay_sweep(config, output, n_embd, delays_ms=delays, rates_mbit=rates)
            print(f"wrote {output}")
            return 0
        results = run_sweep(config, output, n_embd, delays_ms=delays, rates_mbit=rates)
    except MeshnetError as error:
        print(f"meshnet lab sweep: [{error.code}] {error.message}", file=sys.stderr)
        return 2
    plot = write_lab_sweep_plot(results, output.with_suffix(".png"))
    print(f"wrote {output}" + (f" and {plot}" if plot else ""))
    return 0


def deploy_commands() -> dict[str, Command]:
    from meshnet.deploy.config import LocalSwarmConfig
    from meshnet.deploy.lab.lab import LabConfig

    return {
        "lab": Command(
            cmd_lab, "a multi-host lab on this machine: namespaced, capped, shaped nodes", (LabArguments, LabConfig)
        ),
        "up": Command(cmd_up, "start tracker, workers and gateway here and stream a demo", (LocalSwarmConfig,)),
    }
