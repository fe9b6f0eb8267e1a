"""The report's PNG plots (matplotlib, Agg backend), drawn from the results only.

matplotlib is a dev extra, not a runtime dependency: without it no plot is written and the
report says so.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

from meshnet.bench.results import BenchResults, ContextPoint

FIGURE_SIZE = (7, 4.5)


def write_plots(results: BenchResults, folder: Path) -> list[Path]:
    """The plots written into ``folder``: none when matplotlib is not installed."""
    if importlib.util.find_spec("matplotlib") is None:
        return []
    matplotlib: Any = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    pyplot: Any = importlib.import_module("matplotlib.pyplot")
    written = [_concurrency(pyplot, results, folder / "concurrency.png")]
    written += _context(pyplot, results, folder / "context.png")
    written += _lanes(pyplot, results, folder / "lanes.png")
    return written


def _concurrency(pyplot: Any, results: BenchResults, path: Path) -> Path:
    figure, axes = pyplot.subplots(figsize=FIGURE_SIZE)
    sweep = len(results.workload.concurrency)
    for name, lane in results.lanes.items():
        points = sorted((k, run.aggregate_decode_tok_s) for k, run in lane.concurrency.items())
        points = [(k, v) for k, v in points if v is not None]
        if len(points) > 1:
            # Lanes with the whole sweep are the comparison; the rest are drawn faint.
            style = {"linewidth": 2.0} if len(points) == sweep else {"linestyle": ":", "alpha": 0.6}
            axes.plot([k for k, _ in points], [v for _, v in points], marker="o", label=name, **style)
    axes.set(xlabel="concurrent streams", ylabel="aggregate decode tok/s", title="Decode throughput vs concurrency")
    axes.grid(alpha=0.3)
    axes.legend()
    return _save(pyplot, figure, path)


def _context(pyplot: Any, results: BenchResults, path: Path) -> list[Path]:
    scaling = results.context_scaling
    points = scaling.points.items() if scaling is not None else ()
    measured = sorted((k, p) for k, p in points if isinstance(p, ContextPoint) and p.speedup is not None)
    if scaling is None or not measured:
        return []
    figure, axes = pyplot.subplots(figsize=FIGURE_SIZE)
    contexts = [k for k, _ in measured]
    axes.plot(contexts, [p.fast_ms_per_token for _, p in measured], marker="o", label=scaling.fast_lane)
    axes.plot(contexts, [p.slow_ms_per_token for _, p in measured], marker="s", label="recompute")
    axes.set(
        xscale="log",
        yscale="log",
        xlabel="context (tokens)",
        ylabel="ms per generated token",
        title="Per-token decode latency vs context",
    )
    axes.xaxis.set_minor_locator(pyplot.NullLocator())
    axes.set_xticks(contexts, labels=[str(k) for k in contexts])
    axes.grid(alpha=0.3, which="both")
    axes.legend()
    return [_save(pyplot, figure, path)]


def _lanes(pyplot: Any, results: BenchResults, path: Path) -> list[Path]:
    rates = [(name, results.measures(name)) for name in results.lanes]
    bars = [(name, run.decode_tok_s) for name, run in rates if run is not None and run.decode_tok_s is not None]
    if not bars:
        return []
    figure, axes = pyplot.subplots(figsize=FIGURE_SIZE)
    axes.bar([n for n, _ in bars], [v for _, v in bars], color="#4a7ab5")
    axes.set(ylabel="decode tok/s (1 stream)", title="Single-stream decode by lane", yscale="log")
    axes.grid(alpha=0.3, axis="y")
    return [_save(pyplot, figure, path)]


def _save(pyplot: Any, figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
    return path


def write_lab_sweep_plot(results: dict[str, Any], path: Path) -> Path | None:
    """``meshnet lab sweep``'s plot: per-token time against one-way delay, beside its limits."""
    if importlib.util.find_spec("matplotlib") is None:
        return None
    matplotlib: Any = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    pyplot: Any = importlib.import_module("matplotlib.pyplot")
    figure, axes = pyplot.subplots(figsize=FIGURE_SIZE)
    points = results["points"]
    for rate in sorted({p["bandwidth_mbit"] for p in points}):
        row = sorted((p for p in points if p["bandwidth_mbit"] == rate), key=lambda p: p["delay_ms"])
        delays = [p["delay_ms"] for p in row]
        (line,) = axes.plot(delays, [p["per_token_ms"] for p in row], marker="o", label=f"measured, {rate:g} Mbit")
        axes.plot(
            delays,
            [p["limit_ring_ms"] for p in row],
            linestyle="--",
            color=line.get_color(),
            alpha=0.7,
            label=f"limit: 0 ms time + N delays (the ring), {rate:g} Mbit",
        )
    path_row = sorted(
        (p for p in points if p["bandwidth_mbit"] == points[0]["bandwidth_mbit"]), key=lambda p: p["delay_ms"]
    )
    axes.plot(
        [p["delay_ms"] for p in path_row],
        [p["limit_path_ms"] for p in path_row],
        linestyle=":",
        color="grey",
        label="a path's limit: 0 ms time + 2(N-1) delays",
    )
    axes.set(
        xlabel="one-way link delay (ms)",
        ylabel="ms per decoded token",
        title=f"{results['model']}: {results['nodes']} capped nodes over shaped links",
    )
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    return _save(pyplot, figure, path)
