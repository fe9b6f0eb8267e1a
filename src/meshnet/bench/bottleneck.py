"""Name the measured bottleneck behind a failed check: which component of the lane dominates.

Reads only the results document. For a meshnet route a decode step splits into the shards' own
compute (reported by each shard) and per-hop latency (everything else: serialization, gRPC,
loopback, event loops); for a split, into whole-model compute and the cost of splitting; for
concurrency, into how many sessions each engine batch actually carried.
"""

from __future__ import annotations

from typing import Any


def _get(document: Any, path: str) -> Any:
    node = document
    for segment in path.split("/"):
        if not isinstance(node, dict) or segment not in node:
            return None
        node = node[segment]
    return node


def _first_path(expression: dict[str, Any]) -> str:
    if "path" in expression:
        return str(expression["path"])
    if "ratio" in expression:
        return str(expression["ratio"][0])
    if "linear" in expression:
        return str(expression["linear"]["path"])
    if "steps" in expression:  # the sweep's top point: where a route that stops scaling shows why
        steps = expression["steps"]
        return str(steps["path"]).replace("{at}", str(steps["at"][-1]))
    return ""


def diagnose(expression: dict[str, Any], results: dict[str, Any], *, measured: bool) -> str:
    path = _first_path(expression)
    segments = path.split("/")
    if segments[0] == "inputs" and len(segments) > 2:
        return _input(results, segments, measured)
    if segments[0] == "context_scaling":
        return _context(results, segments, measured)
    if segments[0] == "prefill":
        return _prefill(results, segments)
    if segments[0] != "lanes" or len(segments) < 2:
        return f"{path}: not measured" if not measured else f"{path} is off target"
    if not measured:
        return _why_missing(results, segments)
    lane = segments[1]
    if segments[2:3] == ["failures"] or "*" in lane:
        return _failures_or_drift(results, segments)
    if segments[2:3] == ["drift"]:
        return _failures_or_drift(results, segments)
    if segments[2:3] == ["wire"]:
        return _wire(results, lane)
    concurrency = segments[3] if len(segments) > 3 and segments[2] == "concurrency" else "1"
    if lane.startswith("meshnet-"):
        return _route(results, lane, concurrency)
    if lane.startswith("split-"):
        return _split(results, lane)
    return f"{lane} at concurrency {concurrency} is off target"


def _input(results: dict[str, Any], segments: list[str], measured: bool) -> str:
    """A check on another results file (``gate.with_inputs``), diagnosed in that file."""
    name, inner = segments[1], _get(results, f"inputs/{segments[1]}")
    if not isinstance(inner, dict):
        return f"input {name} was not given: meshnet gate --inputs {name}=PATH"
    return f"{name}: " + diagnose({"path": "/".join(segments[2:])}, inner, measured=measured)


def _why_missing(results: dict[str, Any], segments: list[str]) -> str:
    lane = segments[1]
    entry = _get(results, f"lanes/{lane}")
    if entry is None:
        return f"lane {lane} was not part of this run (lanes: {', '.join(sorted(results.get('lanes', {})))})"
    if entry.get("status") != "ok":
        return f"lane {lane} {entry.get('status')}: {entry.get('reason')}"
    if len(segments) > 3 and segments[2] == "concurrency" and segments[3] not in entry.get("concurrency", {}):
        measured = ", ".join(sorted(entry.get("concurrency", {}), key=int))
        beyond_default = segments[3].isdigit() and int(segments[3]) > 8  # only the sweep preset goes past 8
        how = "--concurrency-sweep" if beyond_default else "without --quick"
        return f"lane {lane} was not measured at concurrency {segments[3]} (measured: {measured}); run {how}"
    return f"{'/'.join(segments)} is absent or null in the results"


def _ms(rate: Any) -> float | None:
    return 1000.0 / rate if isinstance(rate, int | float) and rate > 0 else None


def _route(results: dict[str, Any], lane: str, concurrency: str) -> str:
    if concurrency != "1":
        return _route_batched(results, lane, concurrency)
    hops = _get(results, f"lanes/{lane}/hop_timing") or {}
    whole = _ms(_get(results, "lanes/llama-whole/concurrency/1/decode_tok_s"))
    own = _ms(_get(results, f"lanes/{lane}/concurrency/1/decode_tok_s"))
    parts = []
    compute, link, links = hops.get("compute_ms_per_token_p50"), hops.get("link_ms_p50"), hops.get("links")
    if isinstance(compute, int | float) and isinstance(link, int | float) and isinstance(links, int):
        transport = link * links
        head = "per-hop latency dominates" if transport > compute else "time inside the shards dominates"
        parts.append(
            f"{head}: in the hop probe {compute:.2f} ms/token inside the shards (engine queue + llama.cpp, as each "
            f"shard reports it) vs {transport:.2f} ms/token of per-hop latency across {links} link(s) (p50 "
            f"{link:.2f} ms, p95 {hops.get('link_ms_p95') or 0:.2f} ms per link)"
        )
        split = _ms(_get(results, f"lanes/split-{lane.removeprefix('meshnet-')}/concurrency/1/decode_tok_s"))
        if split is not None:
            # The probe runs after the rounds: a difference within the machine's drift between
            # phases says nothing about the worker processes, so it is not attributed to them.
            parts.append(
                f"the same split in process took {split:.2f} ms/token in the rounds (a different phase: "
                f"{compute - split:+.2f} ms/token apart)"
            )
    if own is not None and whole is not None:
        parts.append(f"route {own:.2f} ms/token vs whole-model {whole:.2f} ms/token in the rounds")
    return "; ".join(parts) or f"{lane} has no hop timing to attribute the time to"


def _route_batched(results: dict[str, Any], lane: str, concurrency: str) -> str:
    """A route at concurrency: its throughput, and how many sessions its engines batched."""
    run = _get(results, f"lanes/{lane}/concurrency/{concurrency}") or {}
    parts = []
    rate, ratio = run.get("aggregate_decode_tok_s"), (run.get("vs_reference") or {}).get("aggregate_decode_tok_s")
    if isinstance(rate, int | float):
        versus = f" ({ratio:.2f}x the reference, median of rounds)" if isinstance(ratio, int | float) else ""
        parts.append(f"{rate:.1f} tok/s aggregate decode at concurrency {concurrency}{versus}")
    occupancy = run.get("batch_occupancy")
    shards = int(lane.removeprefix("meshnet-")) if lane.removeprefix("meshnet-").isdigit() else 1
    if isinstance(occupancy, int | float):
        # A shard of a longer route runs whatever steps are ready (session.scheduler): the
        # sessions spread over the shards, so each call carries about k/N of them.
        how = "each shard runs the steps ready when it is free" if shards > 1 else "one shard gathers its sessions"
        parts.append(f"engine batches carried {occupancy:.2f} of {concurrency} sessions ({how})")
    pinning = [n for n in results.get("run", {}).get("notes", []) if n.startswith(f"{lane} workers:")]
    parts += pinning[:1]
    return "; ".join(parts) or f"{lane} at concurrency {concurrency} has no figures to attribute the time to"


def _split(results: dict[str, Any], lane: str) -> str:
    whole = _ms(_get(results, "lanes/llama-whole/concurrency/1/decode_tok_s"))
    own = _ms(_get(results, f"lanes/{lane}/concurrency/1/decode_tok_s"))
    if whole is None or own is None:
        return f"{lane}: decode rates missing"
    extra = own - whole
    share = 100 * extra / whole
    return (
        f"splitting costs {extra:+.2f} ms/token over whole-model {whole:.2f} ms/token ({share:+.0f}%): "
        "per-shard graph launches and boundary copies, no network involved"
    )


def _wire(results: dict[str, Any], lane: str) -> str:
    wire = _get(results, f"lanes/{lane}/wire") or {}
    payload = wire.get("hidden_payload_bytes")
    total = wire.get("bytes_per_token_per_hop")
    if not isinstance(payload, int) or not isinstance(total, int | float):
        return f"{lane}: no wire measurement"
    return (
        f"{total:.0f} bytes per hop per token, of which {payload} are the float32 hidden row: "
        f"{total - payload:.0f} bytes of headers, answer and framing"
    )


def _failures_or_drift(results: dict[str, Any], segments: list[str]) -> str:
    notes = []
    for name, entry in sorted((results.get("lanes") or {}).items()):
        drift = entry.get("drift") or {}
        if entry.get("failures"):
            errors = {e for run in entry.get("concurrency", {}).values() for e in run.get("errors", [])}
            notes.append(f"{name}: {entry['failures']} failed request(s) {sorted(errors)[:2]}")
        agreement = drift.get("token_agreement")
        if segments[2:3] == ["drift"] and isinstance(agreement, int | float) and agreement < 1.0:
            by_k = ", ".join(
                f"k={k}: {run['token_agreement']:.3f}"
                for k, run in entry.get("concurrency", {}).items()
                if isinstance(run.get("token_agreement"), int | float)
            )
            notes.append(
                f"{name}: token agreement {agreement:.3f} ({by_k}), first divergence at generated token "
                f"{drift.get('first_divergence')}, max logit diff {drift.get('max_logit_diff')}"
            )
    return "; ".join(notes) or "no lane reports the problem in detail"


def _prefill(results: dict[str, Any], segments: list[str]) -> str:
    """A route's long-prompt TTFT against what its pipelined chunks could reach at best."""
    phase = results.get("prefill")
    if not isinstance(phase, dict):
        return "the prefill phase was not run (results of schema version 1, or --prefill-prompt 0)"
    name = segments[2] if len(segments) > 2 else "?"
    lane = (phase.get("lanes") or {}).get(name)
    whole = (phase.get("lanes") or {}).get("llama-whole-1-thread") or {}
    if not isinstance(lane, dict) or lane.get("ttft_ms") is None:
        status = f"{lane.get('status')}: {lane.get('reason')}" if isinstance(lane, dict) else "not part of the run"
        return f"prefill lane {name}: {status}"
    parts = [f"{name} TTFT {lane['ttft_ms']:.0f} ms vs whole-model 1 thread {whole.get('ttft_ms') or 0:.0f} ms"]
    busy = [b for b in lane.get("shard_busy_ms", []) if isinstance(b, int | float)]
    if busy:
        parts.append(_pipeline(lane, phase, busy))
    if phase.get("first_token_agrees") is False:
        parts.append("the lanes' first tokens disagree")
    return "; ".join(parts)


def _pipeline(lane: dict[str, Any], phase: dict[str, Any], busy: list[float]) -> str:
    """Perfectly pipelined chunks finish after the slowest shard's work plus one chunk of each other shard."""
    ttft, tokens, chunk = lane["ttft_ms"], phase.get("prompt_tokens") or 1, phase.get("prefill_chunk") or 1
    chunks = max(-(-int(tokens) // int(chunk)), 1)
    bound = max(busy) + (sum(busy) - max(busy)) / chunks
    rates = ", ".join(f"{rate:.0f}" for rate in lane.get("shard_prefill_tok_s", []))
    verdict = (
        "chunks wait between shards: the hand-offs and the in-flight bound (MAX_CHUNKS_IN_FLIGHT, node/ring.py) "
        "cost the rest"
        if ttft > 1.1 * bound
        else "the pipeline runs near its bound: the shards' own prefill speed is the limit"
    )
    return (
        f"the shards were busy {' + '.join(f'{b:.0f}' for b in busy)} ms ({rates} prefill tok/s each), "
        f"{sum(busy) / ttft:.2f} of {len(busy)} cores on average; {chunks} chunks of {chunk} tokens pipelined "
        f"perfectly would take {bound:.0f} ms, measured {ttft - bound:+.0f} ms over that ({verdict})"
    )


def _context(results: dict[str, Any], segments: list[str], measured: bool) -> str:
    points = _get(results, "context_scaling/points") or {}
    if not measured:
        return (
            f"context {segments[2] if len(segments) > 2 else '?'} was not measured "
            f"(measured: {', '.join(sorted(points, key=int)) or 'none'})"
        )
    lane = _get(results, "context_scaling/fast_lane")
    described = []
    for key in sorted(points, key=int):
        point = points[key]
        if segments[2] in (key, "*") and point.get("fast_ms_per_token") is not None:
            described.append(
                f"context {key}: {lane} {point['fast_ms_per_token']:.2f} ms/token vs recompute "
                f"{point.get('slow_ms_per_token') or 0:.1f} ms/token"
            )
    return "; ".join(described) or "no context point to attribute"
