"""The grammar size bound, checked against llama.cpp's own JSON-schema converter as the oracle:
the estimate is never below the grammar the converter writes, stays within a small factor of it
for ordinary schemas, and refuses hostile ones at once, naming the part and the limit."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from llama_cpp.llama_grammar import json_schema_to_gbnf

from meshnet.core.errors import GrammarTooLarge
from meshnet.core.sampling_options import MAX_GRAMMAR_CHARS
from meshnet.engine.constraints import json_schema_constraint
from meshnet.engine.grammar_bound import MAX_SCHEMA_DEPTH, check_grammar_size, grammar_chars_estimate

ORDINARY: list[dict[str, Any]] = [
    {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    {"type": "array", "items": {"type": "string"}, "minItems": 100},
    {"type": "array", "items": {"type": "string"}, "minItems": 10, "maxItems": 300},
    {"type": "string", "minLength": 10, "maxLength": 500},
    {"type": "string", "pattern": "^[a-z]{1,64}$"},
    {"type": "string", "pattern": "^(ab{10}){20}$"},
    {"type": "object", "properties": {f"prop_{i}": {"type": "string"} for i in range(150)}},
    {"enum": [f"value-{i}" for i in range(300)]},
    {"type": "array", "items": {"type": "array", "items": {"type": "integer"}, "minItems": 50}, "minItems": 50},
    {
        "$defs": {"x": {"type": "object", "properties": {"y": {"type": "string", "maxLength": 40}}}},
        "type": "array",
        "items": {"$ref": "#/$defs/x"},
        "maxItems": 30,
    },
    {"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "array", "items": {"type": "number"}}]},
]


@pytest.mark.parametrize("schema", ORDINARY)
def test_the_estimate_bounds_the_real_grammar_from_above_and_closely(schema: dict[str, Any]) -> None:
    real = len(json_schema_to_gbnf(json.dumps(schema)))
    estimate, _ = grammar_chars_estimate(schema)
    assert real <= estimate <= max(4 * real, 4096), (real, estimate)
    check_grammar_size(schema)  # all are within the limit, and built as before
    assert json_schema_constraint(schema).grammar


HOSTILE: list[tuple[dict[str, Any], str]] = [
    ({"type": "array", "items": {"type": "string"}, "minItems": 20_000_000}, "minItems 20000000 at root"),
    ({"type": "array", "items": {"type": "string"}, "maxItems": 10**18}, "maxItems"),
    ({"type": "string", "maxLength": 5_000_000}, "maxLength 5000000"),
    ({"type": "string", "pattern": "^((a{1000}){1000}){1000}$"}, "pattern"),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {}, "minItems": 10**9}}}, "at root-a"),
    ({"enum": ["x" * 1000] * 100}, "enum at root"),
]


@pytest.mark.parametrize(("schema", "named"), HOSTILE)
def test_a_hostile_schema_is_refused_at_once_naming_its_part_and_the_limit(schema: dict[str, Any], named: str) -> None:
    started = time.perf_counter()
    with pytest.raises(GrammarTooLarge) as refused:
        json_schema_constraint(schema)  # the estimate refuses before the converter runs
    assert time.perf_counter() - started < 0.5
    assert named in refused.value.message and str(MAX_GRAMMAR_CHARS) in refused.value.message
    assert refused.value.code == "grammar_too_large"


def test_nesting_deeper_than_the_bound_is_refused() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(MAX_SCHEMA_DEPTH + 1):
        schema = {"type": "array", "items": schema}
    with pytest.raises(GrammarTooLarge, match=f"deeper than {MAX_SCHEMA_DEPTH}"):
        check_grammar_size(schema)


def test_odd_values_are_counted_as_the_converter_would_or_not_at_all() -> None:
    # Non-integer counts repeat nothing in the estimate (the converter itself refuses them).
    for odd in ({"minItems": True}, {"minItems": "x"}, {"maxLength": -5}, {"pattern": "^((((a$"}, {"items": [1, 2]}):
        check_grammar_size(odd)


BODY_SIZED: dict[str, dict[str, Any]] = {
    "properties": {"type": "object", "properties": {f"a{i}": {} for i in range(80_000)}},
    "enum": {"enum": list(range(150_000))},
    "alternatives": {"anyOf": [{} for _ in range(200_000)]},
    "groups": {"type": "string", "pattern": "^" + "(a)" * 300_000 + "$"},
    "nesting": {"type": "string", "pattern": "^" + "(" * 400_000 + "a" + ")" * 400_000 + "$"},
    "braces": {"type": "string", "pattern": "^" + "{" * 900_000 + "$"},
}


@pytest.mark.parametrize("kind", BODY_SIZED)
def test_the_check_of_a_body_sized_schema_stops_early(kind: str) -> None:
    # Run on the event loop, so its cost must stay small however large the schema (~1 MB each;
    # a full walk took 0.3-2 s). Every part adds to the estimate: the walk stops past the limit.
    schema = BODY_SIZED[kind]
    started = time.perf_counter()
    with pytest.raises(GrammarTooLarge):
        check_grammar_size(schema)
    assert time.perf_counter() - started < 0.25
