"""The human report of a results file: Markdown tables and the gate's verdict (plots in ``plots``).

Everything here reads the results only, so a report can be rebuilt from any committed results
file. Plots are skipped, with a line saying so, when matplotlib is not installed.
"""

from __future__ import annotations

from pathlib import Path

from meshnet.bench.gate import evaluate, load_contract, render
from meshnet.bench.plots import write_plots
from meshnet.bench.results import BenchResults, ContextPoint, ExtraLane, LaneResult, Measures, to_json

NONE = "-"
"""Shown where a value was not measured."""
ROUTE = "meshnet-3"
"""The route the headline quotes: three worker processes, the design's reference shape."""


def _fmt(value: object, digits: int = 1, suffix: str = "") -> str:
    if value is None:
        return NONE
    if isinstance(value, float):
        return f"{value:,.{digits}f}{suffix}"
    return f"{value}{suffix}"


def _x(value: float | None) -> str:
    return NONE if value is None else f"{value:.2f}x"


def _ratio(run: Measures | None, name: str) -> float | None:
    return run.vs_reference.get(name) if run is not None else None


def _measured_points(results: BenchResults) -> list[tuple[int, ContextPoint]]:
    scaling = results.context_scaling
    points = scaling.points.items() if scaling is not None else ()
    return sorted((k, p) for k, p in points if isinstance(p, ContextPoint))


def headline(results: BenchResults) -> list[tuple[str, str]]:
    """The figures a README quotes, as (what, value) rows."""
    rows = _rate_rows(results) + _batched_rows(results) + _route_rows(results) + _context_rows(results)
    return rows + _prefill_rows(results)


def _prefill_rows(results: BenchResults) -> list[tuple[str, str]]:
    """Issue 15's two pinned meshnet-2 figures: batched at the top concurrency and long-prompt TTFT."""
    rows = []
    top = max(results.workload.concurrency)
    batched = _ratio(results.measures("meshnet-2", top), "aggregate_decode_tok_s")
    if top > 1 and batched is not None:
        rows.append((f"meshnet-2 (pinned) vs whole 1 thread batched, concurrency {top}", _x(batched)))
    phase = results.prefill
    if phase is not None:
        for name, lane in phase.lanes.items():
            what = f"TTFT, {phase.prompt_tokens}-token prompt, {name}"
            rows.append((what, f"{_fmt(lane.ttft_ms, 0, ' ms')} ({_x(lane.vs_whole_1_thread)} whole 1 thread)"))
    return rows


def _rate_rows(results: BenchResults) -> list[tuple[str, str]]:
    whole = results.measures("llama-whole")
    rows = [
        ("llama-whole decode, 1 stream", _fmt(whole and whole.decode_tok_s, 1, " tok/s")),
        ("llama-whole prefill", _fmt(whole and whole.prefill_tok_s, 0, " tok/s")),
    ]
    for lane in ("split-2", "split-3", "meshnet-1", "meshnet-2", ROUTE):
        run = results.measures(lane)
        if run is not None:
            rate = _fmt(run.decode_tok_s, 1, " tok/s")
            rows.append((f"{lane} decode, 1 stream", f"{rate} ({_x(_ratio(run, 'decode_tok_s'))} whole)"))
    recompute = results.measures("recompute")
    if recompute is not None:
        rows.append(("recompute decode, 1 stream", _fmt(recompute.decode_tok_s, 2, " tok/s")))
    return rows


def _batched_rows(results: BenchResults) -> list[tuple[str, str]]:
    top = max(results.workload.concurrency)
    if top <= 1:
        return []
    rows = []
    for lane in ("llama-whole", ROUTE):
        run = results.measures(lane, top)
        if run is not None:
            rate = _fmt(run.aggregate_decode_tok_s, 1, " tok/s")
            rows.append(
                (f"{lane} aggregate decode at concurrency {top}", f"{rate} (occupancy {_fmt(run.batch_occupancy, 2)})")
            )
    high, low = results.measures(ROUTE, top), results.measures(ROUTE, 1)
    ratio = _ratio(high, "aggregate_decode_tok_s")
    if ratio is not None:
        rows.append((f"{ROUTE} vs whole batched, concurrency {top}", _x(ratio)))
    if high and low and high.aggregate_decode_tok_s and low.aggregate_decode_tok_s:
        rows.append(
            (f"{ROUTE} aggregate, concurrency {top} vs 1", _x(high.aggregate_decode_tok_s / low.aggregate_decode_tok_s))
        )
    return rows


def _route_rows(results: BenchResults) -> list[tuple[str, str]]:
    route = results.lane(ROUTE)
    rows = []
    if route is not None and route.wire is not None:
        target = 4 * results.model.n_embd + 512
        rows.append(
            (
                f"wire bytes per decode token per hop ({ROUTE})",
                f"{route.wire.bytes_per_token_per_hop} B (target <= {target} B)",
            )
        )
    if route is not None and route.hop_timing is not None:
        hops = route.hop_timing
        rows.append(
            (f"per-link latency p50 / p95 ({ROUTE})", f"{_fmt(hops.link_ms_p50, 2)} / {_fmt(hops.link_ms_p95, 2)} ms")
        )
        if hops.seam_crossings_per_token is not None:
            rows.append((f"seam crossings per decode token ({ROUTE})", str(hops.seam_crossings_per_token)))
    return rows


def _context_rows(results: BenchResults) -> list[tuple[str, str]]:
    return [
        (
            f"context {key}: cached vs recompute per token",
            f"{_fmt(point.fast_ms_per_token, 2)} vs {_fmt(point.slow_ms_per_token, 0)} ms ({point.speedup:.0f}x)",
        )
        for key, point in _measured_points(results)
        if point.speedup is not None
    ]


def headline_table(results: BenchResults) -> str:
    lines = ["| Measure | Value |", "|---|---|"]
    lines += [f"| {what} | {value} |" for what, value in headline(results)]
    return "\n".join(lines)


def _lane_row(name: str, lane: LaneResult) -> str:
    run = lane.at(1)
    drift = lane.drift

    def get(field: str) -> float | None:
        return getattr(run, field) if run is not None else None

    status = lane.status if lane.status == "ok" else f"{lane.status}: {lane.reason}"
    artifact = None if lane.artifact_bytes is None else lane.artifact_bytes / 1e6
    rss = None if lane.rss_bytes is None else lane.rss_bytes / 1e6
    return (
        f"| {name} | {status} | {_fmt(get('ttft_ms'))} | {_fmt(get('prefill_tok_s'), 0)} "
        f"| {_fmt(get('decode_tok_s'))} | {_x(_ratio(run, 'decode_tok_s'))} "
        f"| {_fmt(get('token_latency_ms_p50'), 2)} / {_fmt(get('token_latency_ms_p95'), 2)} "
        f"| {_fmt(get('request_latency_ms_p50'), 0)} / {_fmt(get('request_latency_ms_p95'), 0)} "
        f"| {_fmt(lane.seam_bytes_per_token, 0)} | {_fmt(artifact)} | {_fmt(rss)} "
        f"| {_fmt(drift.token_agreement, 3)} | {_fmt(drift.max_logit_diff, 4)} | {lane.failures} |"
    )


def _lane_table(results: BenchResults) -> list[str]:
    return [
        "| Lane | Status | TTFT ms | Prefill tok/s | Decode tok/s | x whole | Token ms p50/p95 | Request ms p50/p95 "
        "| Seam B/token | Artifact MB | RSS MB | Token agreement | Max logit diff | Failures |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(_lane_row(name, lane) for name, lane in results.lanes.items()),
    ]


def _concurrency_cell(run: Measures | None) -> str:
    if run is None:
        return NONE
    itl = f"{_fmt(run.token_latency_ms_p50, 1)}/{_fmt(run.token_latency_ms_p95, 1)}"
    if run.steady_token_latency_ms_p95 is not None:
        itl += f" (steady {_fmt(run.steady_token_latency_ms_p50, 1)}/{_fmt(run.steady_token_latency_ms_p95, 1)})"
    cell = f"{_fmt(run.aggregate_decode_tok_s)} tok/s, occ {_fmt(run.batch_occupancy, 2)}, itl {itl} ms"
    if run.seam_messages_per_token is not None:
        cell += f", {run.seam_messages_per_token:.2f} seam msg/token"
    return cell


def _concurrency_table(results: BenchResults) -> list[str]:
    levels = results.workload.concurrency
    lines = ["| Lane | " + " | ".join(f"k={k}" for k in levels) + " |", "|---|" + "---|" * len(levels)]
    for name, lane in results.lanes.items():
        cells = [_concurrency_cell(lane.at(k)) for k in levels]
        if any(c != NONE for c in cells):
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _route_table(results: BenchResults) -> list[str]:
    lines = [
        "| Lane | Step ms p50/p95 | Shard compute ms/token | Per-link ms p50/p95 | Hops (compute ms p50/p95) "
        "| Wire B/token/hop | Wire B/token (all links) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, lane in results.lanes.items():
        hops, wire = lane.hop_timing, lane.wire
        if hops is None:
            continue
        detail = "; ".join(f"{h.layers}: {_fmt(h.compute_ms_p50, 2)}/{_fmt(h.compute_ms_p95, 2)}" for h in hops.hops)
        lines.append(
            f"| {name} | {_fmt(hops.step_ms_p50, 2)} / {_fmt(hops.step_ms_p95, 2)} "
            f"| {_fmt(hops.compute_ms_per_token_p50, 2)} | {_fmt(hops.link_ms_p50, 2)} / "
            f"{_fmt(hops.link_ms_p95, 2)} | {detail} | {wire.bytes_per_token_per_hop if wire else NONE} "
            f"| {wire.bytes_per_token_total if wire else NONE} |"
        )
    return lines


def _context_table(results: BenchResults) -> list[str]:
    scaling = results.context_scaling
    lines = [
        f"Cached lane: `{scaling.fast_lane if scaling else None}`; {scaling.note if scaling else ''}",
        "",
        "| Context | Cached ms/token | Recompute ms/token | Recompute measured by | Speedup | First token agrees |",
        "|---|---|---|---|---|---|",
    ]
    for key, point in sorted(scaling.points.items()) if scaling else ():
        if not isinstance(point, ContextPoint):
            lines.append(f"| {key} | skipped: {point.skipped} | | | | |")
            continue
        lines.append(
            f"| {key} | {_fmt(point.fast_ms_per_token, 2)} | {_fmt(point.slow_ms_per_token, 1)} "
            f"| {point.slow_source} | {_fmt(point.speedup, 0, 'x')} | {_fmt(point.first_token_agrees)} |"
        )
    return lines


def _preamble(results: BenchResults) -> list[str]:
    run, model, workload = results.run, results.model, results.workload
    hardware = results.environment.hardware
    versions = ", ".join(f"{k} {v}" for k, v in results.environment.runtime.items())
    return [
        f"# meshnet bench: {model.name}",
        "",
        f"Run {run.timestamp}, {run.duration_s:.0f} s{' (quick)' if run.quick else ''}: `{run.command}`",
        "",
        f"Model `{Path(model.path).name}` sha256 `{model.sha256[:16]}…`, {model.n_layers} layers, "
        f"n_embd {model.n_embd}. Workload: {workload.prompt_tokens}-token prompts, {workload.output_tokens} "
        f"output tokens (recompute {workload.recompute_output_tokens}), greedy, {workload.threads} thread(s) per "
        f"llama.cpp context, {workload.repetitions} interleaved rounds ({run.rounds_completed} completed).",
        "",
        f"Machine: {hardware.cpu_count} x {hardware.cpu_model}, {hardware.memory_bytes / 2**30:.1f} GiB; {versions}. "
        f"Other load during rounds (median): {_fmt(results.noise.foreign_cores_median, 2)} cores.",
    ]


def _sections(results: BenchResults, contract: Path | None) -> list[str]:
    verdict = evaluate(to_json(results), load_contract(contract))
    return [
        *("## Headline", "", headline_table(results), ""),
        *(f"## Gate: {verdict.verdict}", "", "```", *render(verdict), "```", ""),
        *("## Lanes at concurrency 1", "", *_lane_table(results), ""),
        "## Aggregate decode throughput vs concurrency",
        "",
        "Aggregate decode tok/s in the steady state (all streams decoding); occ = engine batch occupancy "
        "(sessions per batch); itl = per-stream inter-token latency p50/p95 over the whole run (steady: only the "
        "gaps while every stream decodes, without the prompts still prefilling); seam msg/token = gRPC messages "
        "the route's workers sent each other during the run (their own count) per token streamed, prefill "
        "frames included.",
        *("", *_concurrency_table(results), ""),
        "## Route hops (probe session, one token at a time)",
        "",
        "Per-link latency = (round trip - the shards' reported compute) / one-way crossings of the round trip "
        "(client->head, each seam crossing, head->client): serialization, gRPC, loopback and event loops. "
        "On the ring a decode token crosses N seams (tail->head directly); on the chain it crossed 2(N-1). "
        "Wire bytes are serialized frame sizes plus 14 bytes of gRPC/HTTP-2 framing per message.",
        *("", *_route_table(results), ""),
        *("## Context scaling", "", *_context_table(results), ""),
        *("## Prefill", "", *_prefill_table(results), ""),
        *("## Extra lanes", "", *_extra_table(results), ""),
        *("## How the processes ran", "", *(f"- {note}" for note in results.run.notes), ""),
    ]


def _prefill_table(results: BenchResults) -> list[str]:
    """TTFT of the long prompt: the pinned route vs whole-model at 1 and 2 threads."""
    phase = results.prefill
    if phase is None:
        return ["The prefill phase was not run."]
    lines = [
        f"{phase.note}. First token agrees across lanes: {_fmt(phase.first_token_agrees)}. "
        f"Other load meanwhile: {_fmt(phase.foreign_cores, 2)} cores.",
        "",
        "| Lane | Threads / pinning | TTFT ms | Prefill tok/s | vs whole 1 thread | Shards' prefill tok/s |",
        "|---|---|---|---|---|---|",
    ]
    for name, lane in phase.lanes.items():
        status = "" if lane.status == "ok" else f" ({lane.status}: {lane.reason})"
        shards = ", ".join(f"{rate:,.0f}" for rate in lane.shard_prefill_tok_s) or NONE
        lines.append(
            f"| {name}{status} | {lane.threads} thread(s) x {lane.processes} process(es); {lane.pinning} "
            f"| {_fmt(lane.ttft_ms, 0)} | {_fmt(lane.prefill_tok_s, 0)} | {_x(lane.vs_whole_1_thread)} | {shards} |"
        )
    return lines


def _extra_table(results: BenchResults) -> list[str]:
    """synthetic-1b, llama-rpc-3 and the transformers lanes, each as a ratio to its own whole-model run."""
    if not results.extra_lanes:
        return ["No extra lanes were run."]
    lines = ["| Lane | Decode tok/s | Whole tok/s | vs whole | Token agreement | Notes |", "|---|---|---|---|---|---|"]
    for name, lane in results.extra_lanes.items():
        if lane.skipped is not None:
            lines.append(f"| {name} | {NONE} | {NONE} | {NONE} | {NONE} | skipped: {lane.skipped} |")
            continue
        lines.append(
            f"| {name} | {_fmt(lane.decode_tok_s, 2)} | {_fmt(lane.whole_decode_tok_s, 2)} | "
            f"{_x(lane.vs_whole)} | {_agreement(lane)} | {lane.note} |"
        )
    return lines


def _agreement(lane: ExtraLane) -> str:
    per_prompt = ", ".join(_fmt(value, 3) for value in lane.token_agreement_per_prompt)
    return _fmt(lane.token_agreement, 3) + (f" (per prompt: {per_prompt})" if per_prompt else "")


def write_report(results: BenchResults, folder: Path, *, contract: Path | None = None) -> Path:
    """Write ``report.md`` and its plots into ``folder``; returns the Markdown path."""
    folder.mkdir(parents=True, exist_ok=True)
    plots = write_plots(results, folder)
    lines = [*_preamble(results), "", *_sections(results, contract)]
    lines += [*(f"![{p.stem}]({p.name})" for p in plots), "", *(f"- {note}" for note in results.run.notes)]
    if not plots:
        lines.append("- plots skipped: matplotlib is not installed")
    path = folder / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
