"""The results file: jsonschema refuses each kind of damage, typed values round-trip the JSON shape."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from bench_samples import sample_results, with_issue15_pinned_figures, without

from meshnet.bench.results import SCHEMA_VERSION, ContextPoint, SkippedContext, from_json, to_json
from meshnet.bench.results_file import read_document, read_results, schema_problems, write_results
from meshnet.cli.main import main
from meshnet.core.errors import InvalidArgument

COMMITTED = Path(__file__).parents[3] / "bench" / "results" / "smollm2.json"


def test_sample_results_are_valid() -> None:
    assert schema_problems(sample_results()) == []


def test_missing_required_property_is_reported() -> None:
    problems = schema_problems(without(sample_results(), "model", "sha256"))
    assert problems == ["$.model: 'sha256' is a required property"]


def test_wrong_types_enums_and_ranges_are_reported() -> None:
    results: dict[str, Any] = copy.deepcopy(sample_results())
    results["workload"]["threads"] = "two"
    results["lanes"]["split-3"]["status"] = "fine"
    results["lanes"]["split-3"]["drift"]["token_agreement"] = 1.5
    results["lanes"]["meshnet-3"]["concurrency"]["1"]["decode_tok_s"] = True  # a bool is not a number
    problems = schema_problems(results)
    assert "$.workload.threads: 'two' is not of type 'integer'" in problems
    assert "$.lanes['split-3'].status: 'fine' is not one of ['ok', 'skipped', 'failed']" in problems
    assert "$.lanes['split-3'].drift.token_agreement: 1.5 is greater than the maximum of 1" in problems
    assert "$.lanes['meshnet-3'].concurrency['1'].decode_tok_s: True is not of type 'number', 'null'" in problems
    assert len(problems) == 4


def test_unknown_lanes_and_properties_are_refused() -> None:
    results: dict[str, Any] = copy.deepcopy(sample_results())
    results["lanes"]["mystery"] = results["lanes"]["split-3"]
    results["run"]["surprise"] = 1
    problems = schema_problems(results)
    assert any(p.startswith("$.lanes: ") and "'mystery'" in p for p in problems)
    assert any(p.startswith("$.run: ") and "'surprise'" in p for p in problems)


def test_probe_sections_are_checked_too() -> None:
    results: dict[str, Any] = copy.deepcopy(sample_results())
    del results["lanes"]["meshnet-3"]["hop_timing"]["links"]
    results["lanes"]["meshnet-3"]["wire"]["bytes_per_token_per_hop"] = "many"
    problems = schema_problems(results)
    assert problems == [
        "$.lanes['meshnet-3'].hop_timing: 'links' is a required property",
        "$.lanes['meshnet-3'].wire.bytes_per_token_per_hop: 'many' is not of type 'integer'",
    ]
    results["lanes"]["meshnet-3"]["wire"] = None
    results["lanes"]["meshnet-3"]["hop_timing"] = None
    assert schema_problems(results) == []


def test_schema_version_is_pinned() -> None:
    assert schema_problems(dict(sample_results(), schema_version=3)) == ["$.schema_version: 3 is not one of [1, 2]"]


def test_version_2_adds_the_prefill_section_and_version_1_files_have_none() -> None:
    document = with_issue15_pinned_figures(sample_results())
    assert schema_problems(document) == []
    results = from_json(document)
    assert results.prefill is not None and results.prefill.lanes["meshnet-2-pinned"].shard_busy_ms == (5000.0, 5000.0)
    assert to_json(results) == document
    (problem,) = schema_problems(dict(document, schema_version=1))
    assert problem.startswith("$: False schema does not allow {'prompt_tokens': 2048")  # the prefill section
    broken = copy.deepcopy(document)
    broken["prefill"]["lanes"]["meshnet-2-pinned"]["ttft_ms"] = -1.0
    del broken["prefill"]["lanes"]["llama-whole-1-thread"]["first_token"]
    assert schema_problems(broken) == [
        "$.prefill.lanes['llama-whole-1-thread']: 'first_token' is a required property",
        "$.prefill.lanes['meshnet-2-pinned'].ttft_ms: -1.0 is less than the minimum of 0",
    ]


def test_written_results_are_version_2_without_a_prefill_section_when_none_was_measured() -> None:
    document = to_json(from_json(dict(sample_results(), schema_version=2)))
    assert "prefill" not in document and schema_problems(document) == []


def test_typed_results_round_trip_the_json_shape() -> None:
    document = sample_results()
    results = from_json(document)
    assert results.lanes["meshnet-3"].concurrency[8].batch_occupancy == 2.0
    assert results.lanes["meshnet-3"].hop_timing is not None and results.lanes["meshnet-3"].hop_timing.links == 3
    assert isinstance(results.context_scaling and results.context_scaling.points[2048], ContextPoint)
    assert to_json(results) == document


def test_skipped_context_points_keep_their_own_shape() -> None:
    document = sample_results()
    document["context_scaling"]["points"]["8000"] = {"context": 8000, "skipped": "the time budget has no room"}
    results = from_json(document)
    assert results.context_scaling is not None
    assert results.context_scaling.points[8000] == SkippedContext(8000, "the time budget has no room")
    assert to_json(results) == document and schema_problems(document) == []


def test_the_committed_results_file_reads_and_round_trips() -> None:
    document = json.loads(COMMITTED.read_text())
    results = read_results(COMMITTED)
    # The committed run is of the current schema and carries every section the gate reads.
    assert results.schema_version == SCHEMA_VERSION and results.lanes["meshnet-3"].wire is not None
    assert results.prefill is not None and results.prefill.first_token_agrees
    assert to_json(results) == document


def test_a_version_1_file_of_the_same_run_still_reads_and_round_trips() -> None:
    document = json.loads(COMMITTED.read_text())
    document.pop("prefill")  # version 1 had no prefill phase
    document["schema_version"] = 1
    results = from_json(document)
    assert results.schema_version == 1 and results.prefill is None
    assert to_json(results) == document and schema_problems(document) == []


def test_written_results_are_read_back(tmp_path: Path) -> None:
    results = from_json(sample_results())
    path = tmp_path / "out" / "results.json"
    assert write_results(results, path) == []
    assert read_results(path) == results


def test_a_broken_results_file_is_refused_with_the_path(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(without(sample_results(), "lanes", "meshnet-3", "drift")))
    with pytest.raises(InvalidArgument, match=r"\$\.lanes\['meshnet-3'\]: 'drift' is a required property"):
        read_document(path)


def test_gate_refuses_a_results_file_that_breaks_the_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = copy.deepcopy(sample_results())
    broken["lanes"]["meshnet-3"]["concurrency"]["1"]["decode_tok_s"] = "fast"
    path = tmp_path / "results.json"
    path.write_text(json.dumps(broken))
    assert main(["gate", str(path)]) == 3
    err = capsys.readouterr().err
    assert "is not a valid bench results file" in err and "decode_tok_s: 'fast' is not of type" in err


def test_a_value_the_schema_leaves_open_is_still_checked_by_the_types(tmp_path: Path) -> None:
    results = copy.deepcopy(sample_results())
    results["environment"]["hardware"]["platform"] = 5  # the schema leaves hardware open beyond three keys
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    assert read_document(path) == results
    with pytest.raises(InvalidArgument, match="platform"):
        read_results(path)
