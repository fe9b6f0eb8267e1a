"""The results schema and its small validator: valid results pass, each kind of damage is caught."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from bench_samples import sample_results, without

from meshnet.bench.schema_check import load_schema, validate
from meshnet.core.errors import InvalidArgument

SCHEMA = load_schema()


def test_sample_results_are_valid() -> None:
    assert validate(sample_results(), SCHEMA) == []


def test_missing_required_property_is_reported() -> None:
    errors = validate(without(sample_results(), "model", "sha256"), SCHEMA)
    assert errors == ["$.model: missing required property 'sha256'"]


def test_wrong_types_enums_and_ranges_are_reported() -> None:
    results: dict[str, Any] = copy.deepcopy(sample_results())
    results["workload"]["threads"] = "two"
    results["lanes"]["split-3"]["status"] = "fine"
    results["lanes"]["split-3"]["drift"]["token_agreement"] = 1.5
    results["lanes"]["meshnet-3"]["concurrency"]["1"]["decode_tok_s"] = True  # a bool is not a number
    errors = validate(results, SCHEMA)
    assert "$.workload.threads: expected integer, got str" in errors
    assert "$.lanes.split-3.status: 'fine' is not one of ['ok', 'skipped', 'failed']" in errors
    assert "$.lanes.split-3.drift.token_agreement: 1.5 is above the maximum 1" in errors
    assert "$.lanes.meshnet-3.concurrency.1.decode_tok_s: expected number or null, got bool" in errors
    assert len(errors) == 4


def test_unknown_lanes_and_properties_are_refused() -> None:
    results: dict[str, Any] = copy.deepcopy(sample_results())
    results["lanes"]["mystery"] = results["lanes"]["split-3"]
    results["run"]["surprise"] = 1
    errors = validate(results, SCHEMA)
    assert "$.lanes: unexpected property 'mystery'" in errors
    assert "$.run: unexpected property 'surprise'" in errors


def test_schema_version_is_pinned() -> None:
    results = dict(sample_results(), schema_version=2)
    assert validate(results, SCHEMA) == ["$.schema_version: expected 1, got 2"]


def test_unsupported_schema_keywords_fail_loudly() -> None:
    with pytest.raises(InvalidArgument, match="unsupported keywords"):
        validate({}, {"type": "object", "oneOf": []})
