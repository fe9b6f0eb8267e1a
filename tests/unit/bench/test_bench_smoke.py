"""A whole ``meshnet bench --quick`` on the tiny synthetic model: in-process lanes, two worker
processes on loopback, the context phase, the results file, the report and the gate.

It runs in seconds and exists so a harness that rots (a renamed field, a lane that no longer
starts, a schema slip) fails ``make test`` instead of the next real benchmark. It holds whatever
verdict the gate reaches on a toy model to be the gate's verdict over these very results, well
formed, in the report and from ``meshnet gate``; which verdict a result deserves is
test_bench_gate.py's subject.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meshnet.bench.gate import EXIT_CODES, evaluate, load_contract, render
from meshnet.bench.results_file import schema_problems
from meshnet.cli.main import main

LANES = "llama-whole,split-2,recompute,meshnet-2"


@pytest.fixture(scope="module")
def bench_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, int]:
    folder = tmp_path_factory.mktemp("bench")
    out, report = folder / "results.json", folder / "report"
    code = main(
        [
            "--data-dir",
            str(folder / "data"),
            "bench",
            "--model",
            str(tiny_model),
            "--quick",
            "--lanes",
            LANES,
            "--out",
            str(out),
            "--report",
            str(report),
            "--budget",
            "120",
            "--note",
            "a smoke run, say the results",
        ]
    )
    return json.loads(out.read_text()), report, code


def test_results_validate_against_the_schema(bench_run: tuple[dict[str, Any], Path, int]) -> None:
    results, _, code = bench_run
    assert code == 0
    assert schema_problems(results) == []
    assert results["run"]["quick"] and results["run"]["rounds_completed"] == 2
    assert results["run"]["notes"][-1] == "a smoke run, say the results"  # --note, recorded as given
    splits = [note for note in results["run"]["notes"] if note.startswith("decode split ")]
    assert splits and all("from measured cost a row at position 76 " in note for note in splits)  # 64 + 24 // 2
    assert results["model"]["n_embd"] == 64 and len(results["model"]["sha256"]) == 64


def test_every_lane_measured(bench_run: tuple[dict[str, Any], Path, int]) -> None:
    lanes = bench_run[0]["lanes"]
    assert set(lanes) == set(LANES.split(","))
    for name in LANES.split(","):
        lane = lanes[name]
        assert lane["status"] == "ok" and lane["failures"] == 0, lane
        assert lane["concurrency"]["1"]["decode_tok_s"] > 0
        assert lane["artifact_bytes"] > 0
    assert set(lanes["meshnet-2"]["concurrency"]) == {"1", "4"}
    assert set(lanes["recompute"]["concurrency"]) == {"1"}
    assert len(lanes["meshnet-2"]["rss_bytes_per_process"]) == 2


def test_split_and_route_reproduce_the_whole_model_exactly(bench_run: tuple[dict[str, Any], Path, int]) -> None:
    lanes = bench_run[0]["lanes"]
    for name in ("split-2", "meshnet-2"):
        assert lanes[name]["drift"]["token_agreement"] == 1.0
        assert lanes[name]["drift"]["compared_tokens"] > 0
    assert lanes["split-2"]["drift"]["max_logit_diff"] == 0.0


def test_seam_bytes_and_hop_timing(bench_run: tuple[dict[str, Any], Path, int]) -> None:
    lanes = bench_run[0]["lanes"]
    assert lanes["llama-whole"]["seam_bytes_per_token"] == 0.0
    assert lanes["split-2"]["seam_bytes_per_token"] == 4 * 64
    # Recompute moves the whole sequence across the seam for every token.
    assert lanes["recompute"]["seam_bytes_per_token"] >= 64 * 4 * 64
    wire, hops = lanes["meshnet-2"]["wire"], lanes["meshnet-2"]["hop_timing"]
    assert wire["hidden_payload_bytes"] == 256 and 256 < wire["bytes_per_token_per_hop"] < 256 + 512
    # client->head, the seam out and back (a route of two runs on the chain), head->client
    assert hops["links"] == 4 and hops["seam_crossings_per_token"] == 2
    assert len(hops["hops"]) == 2 and hops["step_ms_p50"] > 0


def test_seam_messages_per_token_are_the_workers_count_at_every_concurrency(
    bench_run: tuple[dict[str, Any], Path, int],
) -> None:
    lanes = bench_run[0]["lanes"]
    # Two shards, a 64-token prompt in one 64-token chunk: the frame on and the token back, per
    # token of a single stream (test_bench_seam_messages.py shows the decode part of it alone).
    # Concurrent streams share ring batches whenever an engine step ran several of them, so
    # their count is at most that (how far below depends on timing; the worker route tests
    # assert fewer messages than rows).
    route = lanes["meshnet-2"]["concurrency"]
    assert route["1"]["seam_messages_per_token"] == 2.0
    assert all(0 < run["seam_messages_per_token"] <= 2.0 for run in route.values())
    assert all("seam_messages_per_token" not in run for run in lanes["split-2"]["concurrency"].values())


def test_context_scaling_points(bench_run: tuple[dict[str, Any], Path, int]) -> None:
    scaling = bench_run[0]["context_scaling"]
    assert scaling["fast_lane"] == "meshnet-3"
    for point in scaling["points"].values():
        assert point["speedup"] > 0 and point["first_token_agrees"] is True


def test_report_and_plots_are_written(bench_run: tuple[dict[str, Any], Path, int]) -> None:
    _, report, _ = bench_run
    text = (report / "report.md").read_text()
    assert "## Headline" in text and "| meshnet-2 |" in text
    for plot in ("concurrency.png", "context.png", "lanes.png"):
        assert (report / plot).read_bytes()[:4] == b"\x89PNG"


def test_the_gate_judges_these_results_and_the_report_shows_its_verdict(
    bench_run: tuple[dict[str, Any], Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    # On a toy model any verdict may come (its route can lose to recompute on tiny contexts):
    # what must hold is that the gate judged every check of the contract on the fresh results,
    # and that the report and `meshnet gate` say the same.
    results, report, _ = bench_run
    contract = load_contract()
    verdict = evaluate(results, contract)
    assert verdict.verdict in EXIT_CODES and verdict.contract_version == contract["version"]
    entries = contract["stop_conditions"] + contract["requirements"]
    assert [check.id for check in verdict.checks] == [entry["id"] for entry in entries]
    assert any(check.values for check in verdict.checks), "the gate found no measured value in the results"
    section = "\n".join([f"## Gate: {verdict.verdict}", "", "```", *render(verdict), "```"])
    assert section in (report / "report.md").read_text()
    capsys.readouterr()
    code = main(["gate", str(report.parent / "results.json")])
    assert code == verdict.exit_code
    assert capsys.readouterr().out.splitlines() == render(verdict)


def test_prefill_phase_times_the_long_prompt_on_three_subjects(bench_run: tuple[dict[str, Any], Path, int]) -> None:
    results, report, _ = bench_run
    phase = results["prefill"]
    assert results["schema_version"] == 2
    # A quick run times a shorter prompt than the full run's 2,048 tokens, and says so.
    assert phase["quick"] and phase["prompt_tokens"] == 256 and "quick" in phase["note"]
    assert set(phase["lanes"]) == {"llama-whole-1-thread", "llama-whole-2-threads", "meshnet-2-pinned"}
    assert phase["rounds"] >= 1 and phase["first_token_agrees"] is True
    whole, route = phase["lanes"]["llama-whole-1-thread"], phase["lanes"]["meshnet-2-pinned"]
    assert whole["vs_whole_1_thread"] == 1.0 and phase["lanes"]["llama-whole-2-threads"]["threads"] == 2
    assert route["status"] == "ok" and route["processes"] == 2 and route["ttft_ms"] > 0
    assert route["pinning"].startswith("process 0 -> core ") and route["vs_whole_1_thread"] > 0
    assert len(route["shard_busy_ms"]) == 2 and len(route["shard_prefill_tok_s"]) == 2
    assert len({lane["first_token"] for lane in phase["lanes"].values()}) == 1
    text = (report / "report.md").read_text()
    assert "## Prefill" in text and "| meshnet-2-pinned |" in text
