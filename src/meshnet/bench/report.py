"""The human report of a results file: Markdown tables, PNG plots (matplotlib, Agg), the gate.

Everything here reads the results document only, so a report can be rebuilt from any committed
results file. Plots are skipped, with a line saying so, when matplotlib is not installed.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

from meshnet.bench.gate import evaluate, load_contract, render

NONE = "-"
"""Shown where a value was not measured."""


def _fmt(value: Any, digits: int = 1, suffix: str = "") -> str:
    if value is None:
        return NONE
    if isinstance(value, float):
        return f"{value:,.{digits}f}{suffix}"
    return f"{value}{suffix}"


def _lane_run(results: dict[str, Any], lane: str, k: int | str = 1) -> dict[str, Any]:
    return results.get("lanes", {}).get(lane, {}).get("concurrency", {}).get(str(k), {})


def _x(value: Any) -> str:
    return NONE if value is None else f"{value:.2f}x"


def headline(results: dict[str, Any]) -> list[tuple[str, str]]:
    """The figures a README quotes, as (what, value) rows."""
    whole = _lane_run(results, "llama-whole")
    rows = [
        ("llama-whole decode, 1 stream", _fmt(whole.get("decode_tok_s"), 1, " tok/s")),
        ("llama-whole prefill", _fmt(whole.get("prefill_tok_s"), 0, " tok/s")),
    ]
    for lane in ("split-2", "split-3", "meshnet-1", "meshnet-2", "meshnet-3"):
        run = _lane_run(results, lane)
        if run:
            ratio = run.get("vs_reference", {}).get("decode_tok_s")
            rate = _fmt(run.get("decode_tok_s"), 1, " tok/s")
            rows.append((f"{lane} decode, 1 stream", f"{rate} ({_x(ratio)} whole)"))
    recompute = _lane_run(results, "recompute")
    if recompute:
        rows.append(("recompute decode, 1 stream", _fmt(recompute.get("decode_tok_s"), 2, " tok/s")))
    concurrency = results.get("workload", {}).get("concurrency", [])
    top = max(concurrency) if concurrency else None
    if top and top > 1:
        for lane in ("llama-whole", "meshnet-3"):
            run = _lane_run(results, lane, top)
            if run:
                rows.append(
                    (
                        f"{lane} aggregate decode at concurrency {top}",
                        f"{_fmt(run.get('aggregate_decode_tok_s'), 1, ' tok/s')} "
                        f"(occupancy {_fmt(run.get('batch_occupancy'), 2)})",
                    )
                )
        ratio = _lane_run(results, "meshnet-3", top).get("vs_reference", {}).get("aggregate_decode_tok_s")
        if ratio is not None:
            rows.append((f"meshnet-3 vs whole batched, concurrency {top}", _x(ratio)))
        high = _lane_run(results, "meshnet-3", top).get("aggregate_decode_tok_s")
        low = _lane_run(results, "meshnet-3", 1).get("aggregate_decode_tok_s")
        if high and low:
            rows.append((f"meshnet-3 aggregate, concurrency {top} vs 1", _x(high / low)))
    wire = results.get("lanes", {}).get("meshnet-3", {}).get("wire") or {}
    if wire:
        n_embd = results.get("model", {}).get("n_embd", 0)
        rows.append(
            (
                "wire bytes per decode token per hop (meshnet-3)",
                f"{wire.get('bytes_per_token_per_hop')} B (target <= {4 * n_embd + 512} B)",
            )
        )
    hops = results.get("lanes", {}).get("meshnet-3", {}).get("hop_timing") or {}
    if hops:
        rows.append(
            (
                "per-link latency p50 / p95 (meshnet-3)",
                f"{_fmt(hops.get('link_ms_p50'), 2)} / {_fmt(hops.get('link_ms_p95'), 2)} ms",
            )
        )
    for key, point in sorted((results.get("context_scaling") or {}).get("points", {}).items(), key=lambda i: int(i[0])):
        if point.get("speedup") is not None:
            rows.append(
                (
                    f"context {key}: cached vs recompute per token",
                    f"{_fmt(point.get('fast_ms_per_token'), 2)} vs {_fmt(point.get('slow_ms_per_token'), 0)} ms "
                    f"({point['speedup']:.0f}x)",
                )
            )
    return rows


def headline_table(results: dict[str, Any]) -> str:
    lines = ["| Measure | Value |", "|---|---|"]
    lines += [f"| {what} | {value} |" for what, value in headline(results)]
    return "\n".join(lines)


def _lane_table(results: dict[str, Any]) -> list[str]:
    lines = [
        "| Lane | Status | TTFT ms | Prefill tok/s | Decode tok/s | x whole | Token ms p50/p95 | Request ms p50/p95 "
        "| Seam B/token | Artifact MB | RSS MB | Token agreement | Max logit diff | Failures |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, lane in results.get("lanes", {}).items():
        run = lane.get("concurrency", {}).get("1", {})
        drift = lane.get("drift", {})
        rss = lane.get("rss_bytes")
        artifact = lane.get("artifact_bytes")
        status = lane["status"] if lane["status"] == "ok" else f"{lane['status']}: {lane.get('reason')}"
        lines.append(
            f"| {name} | {status} | {_fmt(run.get('ttft_ms'))} | {_fmt(run.get('prefill_tok_s'), 0)} "
            f"| {_fmt(run.get('decode_tok_s'))} | {_x(run.get('vs_reference', {}).get('decode_tok_s'))} "
            f"| {_fmt(run.get('token_latency_ms_p50'), 2)} / {_fmt(run.get('token_latency_ms_p95'), 2)} "
            f"| {_fmt(run.get('request_latency_ms_p50'), 0)} / {_fmt(run.get('request_latency_ms_p95'), 0)} "
            f"| {_fmt(lane.get('seam_bytes_per_token'), 0)} | {_fmt(None if artifact is None else artifact / 1e6)} "
            f"| {_fmt(None if rss is None else rss / 1e6)} | {_fmt(drift.get('token_agreement'), 3)} "
            f"| {_fmt(drift.get('max_logit_diff'), 4)} | {lane.get('failures')} |"
        )
    return lines


def _concurrency_table(results: dict[str, Any]) -> list[str]:
    levels = results.get("workload", {}).get("concurrency", [])
    lines = ["| Lane | " + " | ".join(f"k={k}" for k in levels) + " |", "|---|" + "---|" * len(levels)]
    for name, lane in results.get("lanes", {}).items():
        cells = []
        for k in levels:
            run = lane.get("concurrency", {}).get(str(k))
            if not run:
                cells.append(NONE)
                continue
            itl = f"{_fmt(run.get('token_latency_ms_p50'), 1)}/{_fmt(run.get('token_latency_ms_p95'), 1)}"
            cells.append(
                f"{_fmt(run.get('aggregate_decode_tok_s'))} tok/s, occ {_fmt(run.get('batch_occupancy'), 2)}, "
                f"itl {itl} ms"
            )
        if any(c != NONE for c in cells):
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _route_tables(results: dict[str, Any]) -> list[str]:
    lines = [
        "| Lane | Step ms p50/p95 | Shard compute ms/token | Per-link ms p50/p95 | Hops (compute ms p50/p95) "
        "| Wire B/token/hop | Wire B/token (all links) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, lane in results.get("lanes", {}).items():
        hops, wire = lane.get("hop_timing"), lane.get("wire") or {}
        if not hops:
            continue
        detail = "; ".join(
            f"{h['layers']}: {_fmt(h.get('compute_ms_p50'), 2)}/{_fmt(h.get('compute_ms_p95'), 2)}"
            for h in hops.get("hops", [])
        )
        lines.append(
            f"| {name} | {_fmt(hops.get('step_ms_p50'), 2)} / {_fmt(hops.get('step_ms_p95'), 2)} "
            f"| {_fmt(hops.get('compute_ms_per_token_p50'), 2)} | {_fmt(hops.get('link_ms_p50'), 2)} / "
            f"{_fmt(hops.get('link_ms_p95'), 2)} | {detail} | {wire.get('bytes_per_token_per_hop', NONE)} "
            f"| {wire.get('bytes_per_token_total', NONE)} |"
        )
    return lines


def _context_table(results: dict[str, Any]) -> list[str]:
    scaling = results.get("context_scaling") or {}
    lines = [
        f"Cached lane: `{scaling.get('fast_lane')}`; {scaling.get('note', '')}",
        "",
        "| Context | Cached ms/token | Recompute ms/token | Recompute measured by | Speedup | First token agrees |",
        "|---|---|---|---|---|---|",
    ]
    for key, point in sorted(scaling.get("points", {}).items(), key=lambda i: int(i[0])):
        if "skipped" in point:
            lines.append(f"| {key} | skipped: {point['skipped']} | | | | |")
            continue
        lines.append(
            f"| {key} | {_fmt(point.get('fast_ms_per_token'), 2)} | {_fmt(point.get('slow_ms_per_token'), 1)} "
            f"| {point.get('slow_source', NONE)} | {_fmt(point.get('speedup'), 0, 'x')} "
            f"| {_fmt(point.get('first_token_agrees'))} |"
        )
    return lines


def write_report(results: dict[str, Any], folder: Path, *, contract: Path | None = None) -> Path:
    """Write ``report.md`` and its plots into ``folder``; returns the Markdown path."""
    folder.mkdir(parents=True, exist_ok=True)
    plots = write_plots(results, folder)
    run, model, env = results["run"], results["model"], results["environment"]
    workload = results["workload"]
    verdict = evaluate(results, load_contract(contract))
    noise = results.get("noise", {}).get("foreign_cores_median")
    lines = [
        f"# meshnet bench: {model['name']}",
        "",
        f"Run {run['timestamp']}, {run['duration_s']:.0f} s{' (quick)' if run['quick'] else ''}: `{run['command']}`",
        "",
        f"Model `{Path(model['path']).name}` sha256 `{model['sha256'][:16]}…`, {model['n_layers']} layers, "
        f"n_embd {model['n_embd']}. Workload: {workload['prompt_tokens']}-token prompts, {workload['output_tokens']} "
        f"output tokens (recompute {workload['recompute_output_tokens']}), greedy, {workload['threads']} thread(s) per "
        f"llama.cpp context, {workload['repetitions']} interleaved rounds ({run['rounds_completed']} completed).",
        "",
        f"Machine: {env['hardware']['cpu_count']} x {env['hardware']['cpu_model']}, "
        f"{env['hardware']['memory_bytes'] / 2**30:.1f} GiB; "
        + ", ".join(f"{k} {v}" for k, v in env["runtime"].items())
        + f". Other load during rounds (median): {_fmt(noise, 2)} cores.",
        "",
        "## Headline",
        "",
        headline_table(results),
        "",
        f"## Gate: {verdict.verdict}",
        "",
        "```",
        *render(verdict),
        "```",
        "",
        "## Lanes at concurrency 1",
        "",
        *_lane_table(results),
        "",
        "## Aggregate decode throughput vs concurrency",
        "",
        "Aggregate decode tok/s in the steady state (all streams decoding); occ = engine batch occupancy "
        "(sessions per batch); itl = per-stream inter-token latency p50/p95.",
        "",
        *_concurrency_table(results),
        "",
        "## Route hops (probe session, one token at a time)",
        "",
        "Per-link latency = (round trip - the shards' reported compute) / links: serialization, gRPC, loopback "
        "and event loops. Wire bytes are serialized frame sizes plus 14 bytes of gRPC/HTTP-2 framing per message.",
        "",
        *_route_tables(results),
        "",
        "## Context scaling",
        "",
        *_context_table(results),
        "",
        *[f"![{p.stem}]({p.name})" for p in plots],
        "",
        *[f"- {note}" for note in run.get("notes", [])],
    ]
    if not plots:
        lines.append("- plots skipped: matplotlib is not installed")
    path = folder / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_plots(results: dict[str, Any], folder: Path) -> list[Path]:
    if importlib.util.find_spec("matplotlib") is None:
        return []
    matplotlib: Any = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    pyplot: Any = importlib.import_module("matplotlib.pyplot")
    written = []
    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    sweep = len(results.get("workload", {}).get("concurrency", []))
    for name, lane in results.get("lanes", {}).items():
        points = sorted((int(k), run.get("aggregate_decode_tok_s")) for k, run in lane.get("concurrency", {}).items())
        points = [(k, v) for k, v in points if v is not None]
        if len(points) > 1:
            # Lanes with the whole sweep are the comparison; the rest are drawn faint.
            style = {"linewidth": 2.0} if len(points) == sweep else {"linestyle": ":", "alpha": 0.6}
            axes.plot([k for k, _ in points], [v for _, v in points], marker="o", label=name, **style)
    axes.set(xlabel="concurrent streams", ylabel="aggregate decode tok/s", title="Decode throughput vs concurrency")
    axes.grid(alpha=0.3)
    axes.legend()
    written.append(_save(pyplot, figure, folder / "concurrency.png"))
    points = (results.get("context_scaling") or {}).get("points", {})
    measured = sorted((int(k), p) for k, p in points.items() if p.get("speedup") is not None)
    if measured:
        figure, axes = pyplot.subplots(figsize=(7, 4.5))
        axes.plot(
            [k for k, _ in measured],
            [p["fast_ms_per_token"] for _, p in measured],
            marker="o",
            label=str(results["context_scaling"]["fast_lane"]),
        )
        axes.plot(
            [k for k, _ in measured], [p["slow_ms_per_token"] for _, p in measured], marker="s", label="recompute"
        )
        axes.set(
            xscale="log",
            yscale="log",
            xlabel="context (tokens)",
            ylabel="ms per generated token",
            title="Per-token decode latency vs context",
        )
        axes.xaxis.set_minor_locator(pyplot.NullLocator())
        axes.set_xticks([k for k, _ in measured], labels=[str(k) for k, _ in measured])
        axes.grid(alpha=0.3, which="both")
        axes.legend()
        written.append(_save(pyplot, figure, folder / "context.png"))
    lanes = [(n, lane.get("concurrency", {}).get("1", {}).get("decode_tok_s")) for n, lane in results["lanes"].items()]
    lanes = [(n, v) for n, v in lanes if v is not None]
    if lanes:
        figure, axes = pyplot.subplots(figsize=(7, 4.5))
        axes.bar([n for n, _ in lanes], [v for _, v in lanes], color="#4a7ab5")
        axes.set(ylabel="decode tok/s (1 stream)", title="Single-stream decode by lane", yscale="log")
        axes.grid(alpha=0.3, axis="y")
        written.append(_save(pyplot, figure, folder / "lanes.png"))
    return written


def _save(pyplot: Any, figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
    return path
