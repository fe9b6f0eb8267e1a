"""Reading and writing bench results files; writing validates against ``results.schema.json``.

Kept apart from the runner so the gate and the report load results without loading llama.cpp.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from meshnet.bench.schema_check import load_schema, validate
from meshnet.core.errors import InvalidArgument


def write_results(results: dict[str, Any], path: Path) -> list[str]:
    """Write the results file atomically; returns schema violations (the file is written either way,
    so a long run is never lost to a schema slip)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(results, indent=1) + "\n")
    partial.replace(path)
    return validate(results, load_schema())


def read_results(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise InvalidArgument(f"cannot read bench results {path}: {error}") from None
    if not isinstance(data, dict):
        raise InvalidArgument(f"{path} does not hold a JSON object")
    return data
