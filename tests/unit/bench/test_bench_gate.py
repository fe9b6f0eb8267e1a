"""The release gate on synthetic results: promote, optimize (with the bottleneck named) and stop."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from bench_samples import Figures, sample_results, with_issue15_pinned_figures, without

import meshnet.bench
from meshnet.bench.gate import Check, evaluate, evaluate_expression, load_contract, render, resolve
from meshnet.cli.main import main
from meshnet.core.errors import InvalidArgument

# These tests judge with v1, whose thresholds the sample figures were chosen for; v4 is the
# default (see the tests at the end).
CONTRACT_V1 = Path(meshnet.bench.__file__).parent / "contract_v1.json"
CONTRACT = load_contract(CONTRACT_V1)
CONTRACT_V2 = load_contract(Path(meshnet.bench.__file__).parent / "contract_v2.json")
CONTRACT_V3 = load_contract(Path(meshnet.bench.__file__).parent / "contract_v3.json")


def verdict_of(figures: Figures) -> tuple[str, dict[str, object]]:
    verdict = evaluate(sample_results(figures), CONTRACT)
    return verdict.verdict, {c.id: c for c in verdict.checks}


def test_passing_results_promote() -> None:
    verdict = evaluate(sample_results(), CONTRACT)
    assert verdict.verdict == "promote" and verdict.exit_code == 0
    assert all(c.outcome in ("pass", "clear") for c in verdict.checks)


def test_slow_route_dominated_by_compute_is_optimize_naming_compute() -> None:
    verdict, checks = verdict_of(replace(Figures(), meshnet3_ratio=0.7, compute_ms=9.0, link_ms=0.5))
    failing = checks["meshnet3-decode-vs-whole"]
    assert verdict == "optimize"
    assert failing.outcome == "fail"  # type: ignore[attr-defined]
    assert "time inside the shards dominates" in failing.bottleneck  # type: ignore[attr-defined]
    assert "the same split in process took" in failing.bottleneck  # type: ignore[attr-defined]


def test_slow_route_dominated_by_hops_is_optimize_naming_per_hop_latency() -> None:
    verdict, checks = verdict_of(replace(Figures(), meshnet3_ratio=0.7, compute_ms=6.0, link_ms=4.0))
    assert verdict == "optimize"
    assert "per-hop latency dominates" in checks["meshnet3-decode-vs-whole"].bottleneck  # type: ignore[attr-defined]


def test_weak_batching_is_optimize_naming_batch_occupancy() -> None:
    verdict, checks = verdict_of(replace(Figures(), batched8_ratio=0.5))
    check = checks["meshnet3-batched8-vs-whole8"]
    assert verdict == "optimize" and check.outcome == "fail"  # type: ignore[attr-defined]
    assert "2.00 of 8 sessions" in check.bottleneck and "engine batches" in check.bottleneck  # type: ignore[attr-defined]


def test_fat_wire_is_optimize_against_a_threshold_from_n_embd() -> None:
    verdict, checks = verdict_of(replace(Figures(), wire_bytes=3000))
    check = checks["seam-bytes-per-token"]
    assert verdict == "optimize" and check.outcome == "fail"  # type: ignore[attr-defined]
    assert check.threshold == 4 * 576 + 512  # type: ignore[attr-defined]
    assert "2304 are the float32 hidden row" in check.bottleneck  # type: ignore[attr-defined]


def test_split_overhead_is_named_for_the_split_requirement() -> None:
    verdict, checks = verdict_of(replace(Figures(), split3_ratio=0.8))
    assert verdict == "optimize"
    assert "splitting costs +2.50 ms/token" in checks["split3-decode-vs-whole"].bottleneck  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("figures", "stop_id"),
    [
        (replace(Figures(), meshnet_agreement=0.98), "greedy-drift-meshnet"),
        (replace(Figures(), split_agreement=0.5), "greedy-drift-split"),
        (replace(Figures(), meshnet3_ratio=0.02, recompute_decode=3.0), "route-slower-than-recompute"),
        (replace(Figures(), context2048_speedup=0.5), "long-context-slower-than-recompute"),
    ],
)
def test_stop_conditions_give_stop(figures: Figures, stop_id: str) -> None:
    verdict = evaluate(sample_results(figures), CONTRACT)
    assert verdict.verdict == "stop" and verdict.exit_code == 2
    assert [c.id for c in verdict.checks if c.outcome == "triggered"] == [stop_id]


def test_stop_wins_over_every_passing_requirement() -> None:
    verdict = evaluate(sample_results(replace(Figures(), meshnet_agreement=0.99)), CONTRACT)
    assert all(c.outcome == "pass" for c in verdict.checks if c.kind == "requirement")
    assert verdict.verdict == "stop"


def test_a_missing_lane_is_optimize_and_says_why() -> None:
    verdict = evaluate(without(sample_results(), "lanes", "meshnet-3"), CONTRACT)
    checks = {c.id: c for c in verdict.checks}
    assert verdict.verdict == "optimize"
    assert checks["meshnet3-decode-vs-whole"].outcome == "missing"
    assert "was not part of this run" in (checks["meshnet3-decode-vs-whole"].bottleneck or "")
    # A stop condition that could not be measured blocks promotion too.
    assert checks["greedy-drift-meshnet"].outcome == "missing"


def test_a_quick_run_without_concurrency_8_is_optimize_pointing_at_the_full_run() -> None:
    results = without(
        without(sample_results(), "lanes", "meshnet-3", "concurrency", "8"), "lanes", "llama-whole", "concurrency", "8"
    )
    verdict = evaluate(results, CONTRACT)
    check = next(c for c in verdict.checks if c.id == "meshnet3-batched8-vs-whole8")
    assert verdict.verdict == "optimize" and check.outcome == "missing"
    assert "not measured at concurrency 8" in (check.bottleneck or "")


def test_failed_requests_fail_their_requirement() -> None:
    verdict, checks = verdict_of(replace(Figures(), failures=2))
    assert verdict == "optimize" and checks["no-failed-requests"].outcome == "fail"  # type: ignore[attr-defined]


def test_paths_resolve_globs_and_skip_nulls() -> None:
    results = sample_results()
    found = dict(resolve(results, "lanes/*/drift/token_agreement"))
    lanes = ("llama-whole", "split-3", "recompute", "meshnet-3")
    assert set(found) == {f"lanes/{n}/drift/token_agreement" for n in lanes}
    results["lanes"]["split-3"]["drift"]["token_agreement"] = None
    values = evaluate_expression(results, {"path": "lanes/split-*/drift/token_agreement"})
    assert values == []
    assert evaluate_expression(results, {"linear": {"path": "model/n_embd", "factor": 4, "constant": 512}}) == [
        ("model/n_embd", 2816.0)
    ]


def test_the_v1_contract_thresholds_are_frozen() -> None:
    # Editing a threshold after seeing results is not allowed: write contract_v2.json instead.
    pinned = {
        "split3-decode-vs-whole": (">=", 0.9),
        "meshnet3-decode-vs-whole": (">=", 0.85),
        "meshnet3-batched8-vs-whole8": (">=", 0.8),
        "meshnet3-concurrency-scaling": (">=", 1.5),
        "context2048-vs-recompute": (">=", 50),
        "no-failed-requests": ("<=", 0),
        "route-slower-than-recompute": ("<", 1.0),
        "long-context-slower-than-recompute": ("<", 1.0),
        "greedy-drift-meshnet": ("<", 1.0),
        "greedy-drift-split": ("<", 1.0),
    }
    entries = CONTRACT["requirements"] + CONTRACT["stop_conditions"]
    assert CONTRACT["version"] == 1
    assert len({e["id"] for e in entries}) == len(entries)
    for entry in entries:
        if entry["id"] in pinned:
            assert (entry["op"], entry["threshold"]["const"]) == pinned[entry["id"]]
    seam = next(e for e in entries if e["id"] == "seam-bytes-per-token")
    assert seam["threshold"] == {"linear": {"path": "model/n_embd", "factor": 4, "constant": 512}}


def test_a_malformed_contract_is_refused(tmp_path: Path) -> None:
    bad = dict(CONTRACT, requirements=[{"id": "x", "value": {"const": 1}, "op": "=~", "threshold": {"const": 1}}])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(InvalidArgument, match="op must be one of"):
        load_contract(path)


def test_render_names_verdict_and_bottleneck() -> None:
    lines = render(evaluate(sample_results(replace(Figures(), meshnet3_ratio=0.5)), CONTRACT))
    assert lines[0].startswith("OPTIMIZE (contract v1, exit 1)")
    assert any("FAIL meshnet3-decode-vs-whole" in line for line in lines)
    assert any("bottleneck:" in line for line in lines)


@pytest.mark.parametrize(
    ("figures", "code"),
    [(Figures(), 0), (replace(Figures(), meshnet3_ratio=0.5), 1), (replace(Figures(), split_agreement=0.9), 2)],
)
def test_gate_command_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], figures: Figures, code: int
) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(sample_results(figures)))
    assert main(["gate", str(path), "--contract", str(CONTRACT_V1)]) == code
    assert ["PROMOTE", "OPTIMIZE", "STOP"][code] in capsys.readouterr().out


def test_gate_command_on_unreadable_input_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "results.json"
    path.write_text("{not json")
    assert main(["gate", str(path)]) == 3
    assert "cannot read bench results" in capsys.readouterr().err


def test_drift_stop_names_the_concurrency_that_diverged() -> None:
    results = sample_results(replace(Figures(), meshnet_agreement=0.95))
    results["lanes"]["meshnet-3"]["concurrency"]["1"]["token_agreement"] = 1.0
    results["lanes"]["meshnet-3"]["concurrency"]["8"]["token_agreement"] = 0.9
    verdict = evaluate(results, CONTRACT)
    drift = next(c for c in verdict.checks if c.id == "greedy-drift-meshnet")
    assert verdict.verdict == "stop" and drift.outcome == "triggered"
    assert "k=1: 1.000, k=8: 0.900" in (drift.bottleneck or "")


def test_the_v2_contract_keeps_the_issue_15_thresholds() -> None:
    contract = CONTRACT_V2
    assert contract["version"] == 2
    pinned = {
        "meshnet3-decode-vs-whole": (">=", 0.9),
        "meshnet3-vs-llama-rpc3": (">=", 1.1),
        "synthetic1b-meshnet3-vs-whole": (">=", 0.97),
        "link-latency-p50": ("<=", 0.4),
        "seam-crossings-per-token": ("<=", 3),
        "meshnet3-occupancy8": (">=", 6),
        "meshnet3-batched8-vs-whole8": (">=", 1.0),
        "greedy-drift-meshnet": ("<", 1.0),
        "greedy-drift-split": ("<", 1.0),
    }
    entries = {entry["id"]: entry for entry in contract["requirements"] + contract["stop_conditions"]}
    for key, (op, threshold) in pinned.items():
        assert (entries[key]["op"], entries[key]["threshold"]["const"]) == (op, threshold), key


def test_v2_reads_the_extra_lanes_and_names_what_was_not_measured() -> None:
    results = sample_results()
    results["extra_lanes"] = {
        "llama-rpc-3": {"vs_whole": 0.8},
        "synthetic-1b": {"vs_whole": 0.98},
    }
    checks = {check.id: check for check in evaluate(results, CONTRACT_V2).checks}
    assert checks["meshnet3-vs-llama-rpc3"].values[0][1] == pytest.approx(0.9 / 0.8)
    assert checks["synthetic1b-meshnet3-vs-whole"].outcome == "pass"
    del results["extra_lanes"]
    checks = {check.id: check for check in evaluate(results, CONTRACT_V2).checks}
    assert checks["synthetic1b-meshnet3-vs-whole"].outcome == "missing"


def test_v3_is_v2_unchanged_plus_the_two_pinned_meshnet2_figures() -> None:
    contract = CONTRACT_V3
    assert contract["version"] == 3
    assert contract["stop_conditions"] == CONTRACT_V2["stop_conditions"]
    v3 = {entry["id"]: entry for entry in contract["requirements"]}
    for entry in CONTRACT_V2["requirements"]:
        assert v3.pop(entry["id"]) == entry
    assert {key: (e["op"], e["threshold"]["const"], e["value"]) for key, e in v3.items()} == {
        "meshnet2-pinned-batched8-vs-whole1": (
            ">=",
            1.5,
            {"path": "lanes/meshnet-2/concurrency/8/vs_reference/aggregate_decode_tok_s"},
        ),
        "ttft2048-meshnet2-vs-whole1": ("<=", 0.7, {"path": "prefill/lanes/meshnet-2-pinned/vs_whole_1_thread"}),
    }


def test_the_default_contract_is_v4_v3_without_the_occupancy_requirement() -> None:
    contract = load_contract()
    assert contract["version"] == 4
    assert contract["stop_conditions"] == CONTRACT_V3["stop_conditions"]
    v3 = [entry for entry in CONTRACT_V3["requirements"] if entry["id"] != "meshnet3-occupancy8"]
    assert contract["requirements"] == v3
    assert len(v3) == len(CONTRACT_V3["requirements"]) - 1


def test_v4_no_longer_judges_occupancy_but_still_reports_it() -> None:
    checks = default_checks(sample_results(replace(Figures(), batched8_ratio=0.5)))
    assert "meshnet3-occupancy8" not in checks
    assert "engine batches carried 2.00 of 8 sessions" in (checks["meshnet3-batched8-vs-whole8"].bottleneck or "")


def default_checks(results: dict[str, Any]) -> dict[str, Check]:
    return {check.id: check for check in evaluate(results, load_contract()).checks}


def test_v3_passes_the_pinned_figures_when_they_meet_the_issue() -> None:
    checks = default_checks(with_issue15_pinned_figures(sample_results()))
    assert checks["meshnet2-pinned-batched8-vs-whole1"].outcome == "pass"
    assert checks["ttft2048-meshnet2-vs-whole1"].outcome == "pass"


def test_a_slow_pipelined_prefill_is_compared_with_its_perfect_pipeline() -> None:
    # TTFT 0.9x whole (11,700 ms) while each shard was busy 5,000 ms: 8 chunks pipelined perfectly
    # would take 5,000 + 5,000 / 8 = 5,625 ms.
    checks = default_checks(with_issue15_pinned_figures(sample_results(), ttft_ratio=0.9))
    check = checks["ttft2048-meshnet2-vs-whole1"]
    assert check.outcome == "fail"
    text = check.bottleneck or ""
    assert "meshnet-2-pinned TTFT 11700 ms vs whole-model 1 thread 13000 ms" in text
    assert "busy 5000 + 5000 ms (410, 410 prefill tok/s each), 0.85 of 2 cores" in text
    assert "8 chunks of 256 tokens pipelined perfectly would take 5625 ms, measured +6075 ms" in text
    assert "chunks wait between shards" in text and "MAX_CHUNKS_IN_FLIGHT" in text


def test_a_prefill_near_its_pipeline_bound_names_the_shards_speed() -> None:
    checks = default_checks(with_issue15_pinned_figures(sample_results(), ttft_ratio=0.75, busy_ms=8700.0))
    text = checks["ttft2048-meshnet2-vs-whole1"].bottleneck or ""
    assert "the pipeline runs near its bound" in text


def test_weak_pinned_batching_names_occupancy_and_the_pinning() -> None:
    checks = default_checks(with_issue15_pinned_figures(sample_results(), batched8_ratio=1.2))
    check = checks["meshnet2-pinned-batched8-vs-whole1"]
    assert check.outcome == "fail" and check.values[0][1] == pytest.approx(1.2)
    text = check.bottleneck or ""
    assert "7.50 of 8 sessions (each shard runs the steps ready when it is free)" in text
    assert "meshnet-2 workers: process 0 -> core 0, process 1 -> core 1" in text


def test_results_without_the_prefill_phase_miss_the_ttft_requirement_and_say_why() -> None:
    checks = default_checks(sample_results())
    check = checks["ttft2048-meshnet2-vs-whole1"]
    assert check.outcome == "missing"
    assert "the prefill phase was not run" in (check.bottleneck or "")
    assert "lane meshnet-2 was not part of this run" in (checks["meshnet2-pinned-batched8-vs-whole1"].bottleneck or "")
