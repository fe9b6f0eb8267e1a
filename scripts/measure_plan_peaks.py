"""Check ``meshnet plan`` against real workers: start the workers a plan proposes, each with its
range and ``--memory-budget-mb``, run one completion per planned session, and record each
worker's peak resident size (VmHWM) beside the plan's figure.

    python scripts/measure_plan_peaks.py --model .data/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --out bench/results/plan-peaks.json

The workers run through the calibration harness (``measure_worker_memory.measure``: mutual TLS
on every link, the reuse store off, since what it keeps grows with the traffic, within whatever
the plan leaves of the budget). ``tests/model/test_plan_peaks_real.py`` runs the same points and
holds each peak within its budget and within 16% of the plan.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from dataclasses import dataclass
from pathlib import Path

from measure_worker_memory import Point, measure

from meshnet.artifact.plan_source import planned_model
from meshnet.core.kv_type import KvType
from meshnet.core.layer_costs import MIB, WorkerLoad
from meshnet.core.swarm_plan import plan_swarm


@dataclass(frozen=True)
class PlanPoint:
    nodes_mb: tuple[int, ...]
    load: WorkerLoad


POINTS = (
    PlanPoint((300, 260, 260), WorkerLoad(sessions=4, context=2048, prefill_chunk=256)),
    PlanPoint((420, 380), WorkerLoad(sessions=8, context=1024, prefill_chunk=256)),
    PlanPoint((300, 280, 280), WorkerLoad(sessions=8, context=2048, prefill_chunk=256, kv_type=KvType.Q8_0)),
)


def measure_plan(point: PlanPoint, model: Path, root: Path) -> list[dict[str, object]]:
    """Each planned node's figures and its worker's measured peak (raises if the plan does not fit)."""
    planned = planned_model(str(model), root)
    plan = plan_swarm(planned.footprint, [mb * MIB for mb in point.nodes_mb], point.load, planned.context_length)
    if not plan.fits:
        raise ValueError(f"{point} does not fit: nothing to start")
    load = point.load
    flags = tuple(("--memory-budget-mb", str(mb), "--kv-type", str(load.kv_type)) for mb in point.nodes_mb)
    ranges = tuple(str(node.layers) for node in plan.nodes)
    run = Point(model.name, ranges, load.sessions, load.context, prefill_chunk=load.prefill_chunk, worker_flags=flags)
    workers = measure(run, model, root / "run", root / "data")
    return [
        {
            "layers": str(node.layers),
            "budget_bytes": node.budget_bytes,
            "sessions": load.sessions,
            "context": load.context,
            "prefill_chunk": load.prefill_chunk,
            "kv_type": str(load.kv_type),
            "planned_bytes": node.total,
            "peak_bytes": worker["after_load"]["VmHWM"],  # type: ignore[index]
        }
        for node, worker in zip(plan.nodes, workers, strict=True)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    nodes = []
    for point in POINTS:
        with tempfile.TemporaryDirectory(prefix="meshnet-plan-peaks-") as raw:
            found = measure_plan(point, args.model, Path(raw))
        for node in found:
            node["over_peak"] = round(node["planned_bytes"] / node["peak_bytes"] - 1, 4)  # type: ignore[operator]
        nodes += found
        print(json.dumps(found), flush=True)
    document = {
        "what": "meshnet plan's per-node memory against the peak (VmHWM) of the workers it proposes",
        "model": args.model.name,
        "machine": {"python": platform.python_version(), "machine": platform.machine()},
        "nodes": nodes,
    }
    args.out.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
