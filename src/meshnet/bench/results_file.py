"""Reading and writing bench results files, checked against ``results.schema.json`` by jsonschema.

Kept apart from the runner so the gate and the report load results without loading llama.cpp.
The schema is checked on the JSON document, before it becomes typed values, so a damaged or
hand-edited file is refused with the path of every violation instead of failing somewhere in
the report.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any, cast

import jsonschema
from pydantic import ValidationError

from meshnet.bench.results import BenchResults, from_json, to_json
from meshnet.core.errors import InvalidArgument

SCHEMA_FILE = "results.schema.json"


def load_schema() -> dict[str, Any]:
    """The results schema shipped with the package."""
    schema: dict[str, Any] = json.loads(resources.files("meshnet.bench").joinpath(SCHEMA_FILE).read_text())
    return schema


def schema_problems(document: object) -> list[str]:
    """Every violation of the results schema as ``json path: message``; empty when valid."""
    validator = jsonschema.Draft202012Validator(load_schema())
    errors = sorted(validator.iter_errors(document), key=lambda error: (error.json_path, error.message))
    return [f"{error.json_path}: {error.message}" for error in errors]


def write_results(results: BenchResults, path: Path) -> list[str]:
    """Write the results file atomically; returns schema violations (the file is written either way,
    so a long run is never lost to a schema slip)."""
    document = to_json(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(document, indent=1) + "\n")
    partial.replace(path)
    return schema_problems(document)


def read_document(path: Path) -> dict[str, Any]:
    """A results file as its JSON document, refused unless it satisfies the schema."""
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise InvalidArgument(f"cannot read bench results {path}: {error}") from None
    problems = schema_problems(document)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InvalidArgument(f"{path} is not a valid bench results file: {problems[0]}{more}")
    return cast(dict[str, Any], document)  # the schema's top level is an object


def read_results(path: Path) -> BenchResults:
    document = read_document(path)
    try:
        return from_json(document)
    except ValidationError as error:  # a value the schema leaves open but the types do not
        raise InvalidArgument(f"{path} is not a valid bench results file: {error}") from None
