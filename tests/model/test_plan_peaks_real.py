"""``meshnet plan`` against reality: the workers it proposes, started with its ranges and its
budgets (``--memory-budget-mb``), loaded with one completion per planned session, peak within
10% of what the plan says each node holds.

Needs MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 and the provisioned SmolLM2. Each worker's peak is
its VmHWM (start-up included) read from /proc after the load, by the calibration script's own
harness (``scripts/measure_worker_memory.py``). The reuse store is off (``--prefix-cache-mb 0``):
what it keeps grows with the traffic, within whatever budget the plan leaves free.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from meshnet.artifact.plan_source import planned_model
from meshnet.core.kv_type import KvType
from meshnet.core.layer_costs import MIB, WorkerLoad
from meshnet.core.swarm_plan import plan_swarm

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from measure_worker_memory import Point, measure

ENABLED = os.environ.get("MESHNET_ENABLE_REAL_INFERENCE_TESTS") == "1"
DATA = Path(os.environ.get("MESHNET_DATA_DIR", ".data"))
MODEL = DATA / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
WITHIN = 0.10

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not ENABLED, reason="set MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 to run real-model tests"),
    pytest.mark.skipif(ENABLED and not MODEL.exists(), reason=f"{MODEL} is not provisioned"),
]


@pytest.mark.parametrize(
    ("nodes_mb", "load"),
    [
        ((300, 260, 260), WorkerLoad(sessions=4, context=2048, prefill_chunk=256)),
        ((420, 380), WorkerLoad(sessions=8, context=1024, prefill_chunk=256)),
        ((300, 280, 280), WorkerLoad(sessions=8, context=2048, prefill_chunk=256, kv_type=KvType.Q8_0)),
    ],
)
def test_each_planned_node_peaks_within_ten_percent_of_the_plan(
    nodes_mb: tuple[int, ...], load: WorkerLoad, tmp_path: Path
) -> None:
    model = planned_model(str(MODEL), DATA)
    plan = plan_swarm(model.footprint, [mb * MIB for mb in nodes_mb], load, model.context_length)
    assert plan.fits
    flags = tuple(
        ("--memory-budget-mb", str(mb), "--prefix-cache-mb", "0", "--kv-type", str(load.kv_type)) for mb in nodes_mb
    )
    point = Point(
        MODEL.name,
        tuple(str(node.layers) for node in plan.nodes),
        load.sessions,
        load.context,
        prefill_chunk=load.prefill_chunk,
        worker_flags=flags,
    )
    workers = measure(point, MODEL, tmp_path / "run", tmp_path / "data")
    report = []
    for node, worker in zip(plan.nodes, workers, strict=True):
        peak = worker["after_load"]["VmHWM"]  # type: ignore[index]
        report.append(f"{node.layers}: planned {node.total / MIB:.1f} MiB, peak {peak / MIB:.1f} MiB")
    print("\n".join(report))
    for node, worker in zip(plan.nodes, workers, strict=True):
        peak = worker["after_load"]["VmHWM"]  # type: ignore[index]
        assert abs(node.total - peak) <= WITHIN * peak, report
        assert peak <= node.budget_bytes, report
