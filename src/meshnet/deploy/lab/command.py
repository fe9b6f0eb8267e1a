"""`meshnet lab up|down`: build a lab, run a swarm in it, serve until SIGTERM, remove it all."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from meshnet.core.errors import MeshnetError
from meshnet.deploy.lab.claims import claimed_tags
from meshnet.deploy.lab.lab import Lab, LabConfig, remove_lab, wait_forever
from meshnet.deploy.lab.swarm import start_swarm


def _raise_on_sigterm() -> None:
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def lab_up(config: LabConfig) -> int:
    _raise_on_sigterm()
    lab = Lab(config)
    try:
        plan = lab.build()
        print(f"lab       {plan.subnet} on bridge {plan.bridge} ({len(plan.nodes)} nodes)", flush=True)
        swarm = start_swarm(lab)
        for node in plan.nodes:
            role = "spare" if node.spare else "node"
            cap = f"{node.memory_mb} MiB" if node.memory_mb else "uncapped"
            print(
                f"{role:9s} {node.namespace} {node.address} cpu {node.cpu} {cap} "
                f"layers {swarm.ranges[node.index]} via {swarm.advertised[node.index]}",
                flush=True,
            )
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


def lab_down(tag: str | None) -> int:
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


def lab_sweep(config: LabConfig, output: Path) -> int:
    """The network sweep (``sweep.py``): JSON at ``output``, its plot beside it."""
    from meshnet.artifact.describe import describe_model
    from meshnet.bench.plots import write_lab_sweep_plot
    from meshnet.deploy.lab.sweep import run_sweep

    try:
        results = run_sweep(config, output, describe_model(config.model).n_embd)
    except MeshnetError as error:
        print(f"meshnet lab sweep: [{error.code}] {error.message}", file=sys.stderr)
        return 2
    plot = write_lab_sweep_plot(results, output.with_suffix(".png"))
    print(f"wrote {output}" + (f" and {plot}" if plot else ""))
    return 0
