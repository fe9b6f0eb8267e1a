"""``meshnet plan`` against reality: the workers it proposes, started with its ranges and its
budgets (``--memory-budget-mb``), loaded with one completion per planned session, peak at or
below each node's budget and within 16% of what the plan says the node holds.

Needs MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 and the provisioned SmolLM2. The points and the
harness are ``scripts/measure_plan_peaks.py``'s (which writes bench/results/plan-peaks.json):
each worker's peak is its VmHWM (start-up included) read from /proc after the load, with the
reuse store off (what it keeps grows with the traffic, within what the plan leaves free).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from measure_plan_peaks import POINTS, PlanPoint, measure_plan

ENABLED = os.environ.get("MESHNET_ENABLE_REAL_INFERENCE_TESTS") == "1"
DATA = Path(os.environ.get("MESHNET_DATA_DIR", ".data"))
MODEL = DATA / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
WITHIN = 0.16
"""The cost model counts every calibrated worker up to 16% above its resident size
(tests/unit/core/test_layer_costs.py); a node's peak includes its start-up, so the plan is no
further above that. Measured: a one-range tail's peak moved 18 MiB between two full runs (246.9
and 228.6 MiB against 259.2 planned: 5.0% and 13.4% above); 10% failed the second."""

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not ENABLED, reason="set MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 to run real-model tests"),
    pytest.mark.skipif(ENABLED and not MODEL.exists(), reason=f"{MODEL} is not provisioned"),
]


@pytest.mark.parametrize("point", POINTS, ids=lambda p: f"{len(p.nodes_mb)}-nodes-{p.load.kv_type}")
def test_each_planned_node_peaks_within_its_budget_and_close_to_the_plan(point: PlanPoint, tmp_path: Path) -> None:
    nodes = measure_plan(point, MODEL, tmp_path)
    report = [f"{n['layers']}: planned {n['planned_bytes']}, peak {n['peak_bytes']}" for n in nodes]
    for node in nodes:
        planned, peak = int(node["planned_bytes"]), int(node["peak_bytes"])  # type: ignore[call-overload]
        assert abs(planned - peak) <= WITHIN * peak, report
        assert peak <= int(node["budget_bytes"]), report  # type: ignore[call-overload]
