"""``meshnet bench | bench-tls | gate``: measuring the swarm and judging the measurements."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from meshnet.cli.arguments import BenchOutputs, GateArguments
from meshnet.cli.common import Command, provisioned_model
from meshnet.cli.flags import config_from_arguments, given_arguments


def cmd_bench(args: argparse.Namespace) -> int:
    import shlex

    from meshnet.bench.command import bench_command
    from meshnet.bench.config import BenchConfig, quick_config

    given = given_arguments(BenchConfig, args)
    config = BenchConfig(
        model=given.pop("model", None) or _default_model(args.data_dir, synthetic_3b=bool(given.get("synthetic_3b"))),
        data_dir=args.data_dir,
        command=shlex.join(["meshnet", *sys.argv[1:]]),
    )
    if given.get("quick"):
        config = quick_config(config)
    if given.get("gemma3"):
        from meshnet.bench.gemma3 import gemma3_config

        config = gemma3_config(config, args.data_dir)
    if given.get("synthetic_3b"):
        from meshnet.bench.synthetic_3b import synthetic_3b_config

        config = synthetic_3b_config(config, args.data_dir)
    if given.get("concurrency_sweep"):
        from meshnet.bench.config import sweep_config

        config = sweep_config(config)
    outputs = config_from_arguments(BenchOutputs, args)
    return bench_command(
        replace(config, **given),
        out=outputs.out,
        report_dir=outputs.report,
        say=print,
        note=lambda line: print(line, file=sys.stderr, flush=True),
    )


def _default_model(data_dir: Path, *, synthetic_3b: bool) -> Path:
    """The preset's model (the synthetic-3b run needs no other provisioned), else the default one."""
    if synthetic_3b:
        from meshnet.artifact.synthetic_models import SYNTHETIC_3B, provision_synthetic

        return provision_synthetic(data_dir / "models", SYNTHETIC_3B)
    return provisioned_model(data_dir)


def cmd_bench_tls(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from meshnet.bench.tls_config import TlsCostConfig
    from meshnet.bench.tls_cost import measure_tls_cost

    computed = {"model": lambda: provisioned_model(args.data_dir)}
    config = config_from_arguments(TlsCostConfig, args, computed=computed, fixed={"data_dir": args.data_dir})
    result = asyncio.run(measure_tls_cost(config))
    config.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {config.out}: mTLS/insecure decode ratio {result.get('mtls_decode_ratio')}")
    return 0


def cmd_bench_tracker_scale(args: argparse.Namespace) -> int:
    from meshnet.bench.tracker_scale import measure_tracker_scale, quick, result_path
    from meshnet.bench.tracker_scale_config import TrackerScaleConfig

    config = config_from_arguments(TrackerScaleConfig, args, fixed={"data_dir": args.data_dir})
    if config.quick:
        config = quick(config)
    path = result_path(config)
    if config.mode == "replica-kill":
        from meshnet.bench.replica_kill import measure_replica_kill

        measure_replica_kill(config, path)
    else:
        measure_tracker_scale(config, path)
    print(f"wrote {path}")
    return 0


def cmd_gate(args: argparse.Namespace) -> int:
    from meshnet.bench.command import gate_command

    gate = config_from_arguments(GateArguments, args)
    return gate_command(
        gate.results, gate.contract, say=print, note=lambda line: print(line, file=sys.stderr), inputs=gate.inputs
    )


def bench_commands() -> dict[str, Command]:
    from meshnet.bench.config import BenchConfig
    from meshnet.bench.tls_config import TlsCostConfig
    from meshnet.bench.tracker_scale_config import TrackerScaleConfig

    return {
        "bench": Command(
            cmd_bench,
            "measure whole-model, split, meshnet and recompute lanes; write results",
            (BenchConfig, BenchOutputs),
            skip=("data_dir", "command"),
        ),
        "bench-tls": Command(
            cmd_bench_tls, "decode tok/s and per-link latency of meshnet-N, mTLS vs --insecure", (TlsCostConfig,)
        ),
        "bench-tracker-scale": Command(
            cmd_bench_tracker_scale,
            "a tracker process under simulated nodes and gateway load: latencies, expiries, CPU",
            (TrackerScaleConfig,),
            skip=("data_dir",),
        ),
        "gate": Command(
            cmd_gate, "judge bench results against the performance contract (exit 0/1/2)", (GateArguments,)
        ),
    }
