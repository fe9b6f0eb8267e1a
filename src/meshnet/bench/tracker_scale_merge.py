"""One load point from several generator processes' summaries: their histograms and counts add
up (``membership.load_figures``); the tracker's CPU and memory are the first process's reading
(every process watched the same tracker over nearly the same span); the point is valid only if
every process kept up."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from meshnet.membership.load_figures import from_json, merged, summary, to_json

COUNTED = ("live_nodes_wrongly_expired", "reregistrations", "records_skipped_nothing_routed", "nodes")
RATES = ("routes_per_s", "records_per_s")


def _added(parts: Sequence[Mapping[str, int]]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for part in parts:
        total.update(part)
    return dict(sorted(total.items()))


def _join(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    seconds = max(part["seconds"] for part in parts)
    registers = merged(from_json(part["register_histogram"]) for part in parts)
    return {
        "seconds": seconds,
        "registered": sum(part["registered"] for part in parts),
        "register": summary(registers, max(seconds, 1e-3)),
        "register_histogram": to_json(registers),
        "errors": _added([part["errors"] for part in parts]),
    }


def merge_points(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The summary of one point measured by ``parts`` (each a ``load_generator`` summary)."""
    if len(parts) == 1:  # the same shape as a merged point: one generator section per process
        return {**parts[0], "generator": [parts[0]["generator"]], "generator_processes": 1}
    first = parts[0]
    span_s = first["measure_s"]
    histograms = {call: merged(from_json(part["histograms"][call]) for part in parts) for call in first["histograms"]}
    examples: dict[str, str] = {}
    for part in parts:
        examples = {**part["error_examples"], **examples}
    reasons = [part["invalid_reason"] for part in parts if not part["valid"]]
    return {
        **{key: first[key] for key in ("mass_join", "heartbeat_transport", "trackers", "warmup_s", "measure_s")},
        **{key: sum(part[key] for part in parts) for key in (*COUNTED, *RATES)},
        "calls": {call: summary(histogram, span_s) for call, histogram in histograms.items()},
        "histograms": {call: to_json(histogram) for call, histogram in histograms.items()},
        "errors": _added([part["errors"] for part in parts]),
        "error_examples": dict(sorted(examples.items())),
        "join": _join([part["join"] for part in parts]),
        "warmup": {
            "live_nodes_wrongly_expired": sum(part["warmup"]["live_nodes_wrongly_expired"] for part in parts),
            "reregistrations": sum(part["warmup"]["reregistrations"] for part in parts),
            "errors": _added([part["warmup"]["errors"] for part in parts]),
        },
        "tracker": first["tracker"],
        "generator": [part["generator"] for part in parts],
        "generator_processes": len(parts),
        "valid": not reasons,
        "invalid_reason": "; ".join(reasons) or None,
    }
