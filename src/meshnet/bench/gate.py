"""The release gate: judge a bench results file against a versioned performance contract.

Pure functions over two JSON documents. A contract lists requirements (each must hold) and
stop conditions (any one ends the line of work); values are read from the results by
slash-separated paths whose segments may be globs (``lanes/meshnet-*/drift/token_agreement``).

- stop (exit 2): a stop condition triggers;
- optimize (exit 1): no stop, but a requirement fails or was not measured; each failure names
  the bottleneck (``bottleneck.diagnose``);
- promote (exit 0): every requirement holds and every stop condition was measured and clear.

A contract may name further results files (``inputs``, v5: the synthetic-3b run, the committed
run a regression is judged against); they are read beside the main results under
``inputs/<name>/...``. A check whose value was not measured is shown "not measured", never "pass".
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import operator
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from meshnet.bench.bottleneck import diagnose
from meshnet.core.errors import InvalidArgument

Verdict = Literal["promote", "optimize", "stop"]
Outcome = Literal["pass", "fail", "missing", "triggered", "clear"]
EXIT_CODES: dict[Verdict, int] = {"promote": 0, "optimize": 1, "stop": 2}
OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}
DEFAULT_CONTRACT = "contract_v4.json"


@dataclass(frozen=True)
class Check:
    id: str
    kind: Literal["requirement", "stop"]
    description: str
    outcome: Outcome
    values: tuple[tuple[str, float], ...]
    """Every measured value the check looked at, by the concrete path it came from."""
    op: str
    threshold: float | None
    bottleneck: str | None = None


@dataclass(frozen=True)
class GateVerdict:
    verdict: Verdict
    contract_version: int
    checks: tuple[Check, ...]

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]


def load_contract(path: Path | None = None) -> dict[str, Any]:
    """A contract file, or the packaged default contract (v4); its structure is checked before use."""
    try:
        if path is None:
            text = resources.files("meshnet.bench").joinpath(DEFAULT_CONTRACT).read_text()
        else:
            text = Path(path).read_text()
        contract = json.loads(text)
    except (OSError, ValueError) as error:
        raise InvalidArgument(f"cannot read the performance contract {path or DEFAULT_CONTRACT}: {error}") from None
    check_contract(contract)
    return contract


def check_contract(contract: object) -> None:
    if not isinstance(contract, dict) or not isinstance(contract.get("version"), int):
        raise InvalidArgument("a contract is a JSON object with an integer 'version'")
    for section in ("requirements", "stop_conditions"):
        entries = contract.get(section)
        if not isinstance(entries, list):
            raise InvalidArgument(f"the contract has no '{section}' list")
        for entry in entries:
            if not isinstance(entry, dict) or not {"id", "value", "op", "threshold"} <= set(entry):
                raise InvalidArgument(f"every entry of '{section}' needs id, value, op and threshold: {entry}")
            if entry["op"] not in OPERATORS:
                raise InvalidArgument(f"{entry['id']}: op must be one of {sorted(OPERATORS)}, got {entry['op']!r}")


def resolve(document: object, path: str) -> list[tuple[str, object]]:
    """Every (concrete path, value) that ``path`` names; glob segments match dict keys."""
    found: list[tuple[str, object]] = [("", document)]
    for segment in path.split("/"):
        step: list[tuple[str, object]] = []
        for prefix, node in found:
            if not isinstance(node, dict):
                continue
            keys = sorted(k for k in node if fnmatch.fnmatchcase(k, segment)) if _is_glob(segment) else [segment]
            step += [(f"{prefix}/{k}".lstrip("/"), node[k]) for k in keys if k in node]
        found = step
    return found


def _is_glob(segment: str) -> bool:
    return any(c in segment for c in "*?[")


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def evaluate_expression(results: object, expression: dict[str, Any]) -> list[tuple[str, float]]:
    """The measured values an expression names (missing and null values are left out)."""
    if "const" in expression:
        value = _number(expression["const"])
        return [] if value is None else [("const", value)]
    if "path" in expression:
        values = [(p, _number(v)) for p, v in resolve(results, expression["path"])]
        return [(p, v) for p, v in values if v is not None]
    if "ratio" in expression:
        top, bottom = expression["ratio"]
        if _is_glob(top) or _is_glob(bottom):
            raise InvalidArgument("a ratio takes two plain paths, not globs")
        a, b = evaluate_expression(results, {"path": top}), evaluate_expression(results, {"path": bottom})
        return [(f"{top} / {bottom}", a[0][1] / b[0][1])] if a and b and b[0][1] else []
    if "steps" in expression:
        return _steps(results, expression["steps"])
    if "linear" in expression:
        spec = expression["linear"]
        base = evaluate_expression(results, {"path": spec["path"]})
        if not base:
            return []
        return [(spec["path"], spec.get("factor", 1.0) * base[0][1] + spec.get("constant", 0.0))]
    raise InvalidArgument(f"unknown value expression {expression}: use const, path, ratio, steps or linear")


def _steps(results: object, spec: dict[str, Any]) -> list[tuple[str, float]]:
    """Each point's value over the previous point's, along ``at`` (``{at}`` in ``path`` names the
    point): all of them, or none when a point was not measured, so a sweep with a gap is "not
    measured" rather than judged on the points that happen to be there."""
    template, points = str(spec["path"]), list(spec["at"])
    if "{at}" not in template or len(points) < 2:
        raise InvalidArgument("steps need a path with {at} and at least two points")
    values = [evaluate_expression(results, {"path": template.replace("{at}", str(point))}) for point in points]
    if not all(values) or any(v[0][1] <= 0 for v in values[:-1]):
        return []
    return [
        (f"{later[0][0]} / {earlier[0][0]}", later[0][1] / earlier[0][1])
        for earlier, later in itertools.pairwise(values)
    ]


def _check(results: dict[str, Any], entry: dict[str, Any], kind: Literal["requirement", "stop"]) -> Check:
    values = evaluate_expression(results, entry["value"])
    thresholds = evaluate_expression(results, entry["threshold"])
    threshold = thresholds[0][1] if thresholds else None
    compare = OPERATORS[entry["op"]]
    description = str(entry.get("description", entry["id"]))
    if not values or threshold is None:
        # An unmeasured stop condition is not a pass either: it blocks promotion.
        outcome: Outcome = "missing"
    elif kind == "requirement":
        outcome = "pass" if all(compare(v, threshold) for _, v in values) else "fail"
    else:
        outcome = "triggered" if any(compare(v, threshold) for _, v in values) else "clear"
    bottleneck = None
    if outcome in ("fail", "missing", "triggered"):
        bottleneck = diagnose(entry["value"], results, measured=bool(values))
    return Check(entry["id"], kind, description, outcome, tuple(values), entry["op"], threshold, bottleneck)


def with_inputs(results: dict[str, Any], inputs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The main results with other results files beside them under ``inputs/<name>`` (v5 judges
    the synthetic-3b run and compares with a committed run): the paths of a contract reach them
    there, and a name not given leaves its checks "not measured"."""
    return {**results, "inputs": dict(inputs)}


def missing_inputs(contract: dict[str, Any], given: set[str]) -> list[str]:
    """The inputs a contract names that were not given, each with what it should be."""
    named = contract.get("inputs", {})
    return [f"{name}: {what}" for name, what in sorted(named.items()) if name not in given]


def evaluate(results: dict[str, Any], contract: dict[str, Any]) -> GateVerdict:
    check_contract(contract)
    checks = [_check(results, entry, "stop") for entry in contract["stop_conditions"]]
    checks += [_check(results, entry, "requirement") for entry in contract["requirements"]]
    if any(c.outcome == "triggered" for c in checks):
        verdict: Verdict = "stop"
    elif all(c.outcome in ("pass", "clear") for c in checks):
        verdict = "promote"
    else:
        verdict = "optimize"
    return GateVerdict(verdict, int(contract["version"]), tuple(checks))


def render(verdict: GateVerdict) -> list[str]:
    """Lines for a terminal: the verdict first, then every check and, for failures, the bottleneck."""
    lines = [f"{verdict.verdict.upper()} (contract v{verdict.contract_version}, exit {verdict.exit_code})"]
    marks = {"pass": "ok  ", "clear": "ok  ", "fail": "FAIL", "missing": "MISS", "triggered": "STOP"}
    for check in verdict.checks:
        shown = ", ".join(f"{v:.4g}" for _, v in check.values[:4]) or "not measured"
        limit = "?" if check.threshold is None else f"{check.threshold:.4g}"
        rule = "stop if" if check.kind == "stop" else "need"
        lines.append(f"  {marks[check.outcome]} {check.id}: {shown} ({rule} {check.op} {limit})")
        if check.bottleneck:
            lines.append(f"       bottleneck: {check.bottleneck}")
    return lines
