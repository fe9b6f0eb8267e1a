"""What one measured run records, and the pure functions that turn runs into lane metrics.

Definitions used everywhere (the report and the gate quote them):
- TTFT: request submitted -> first token sampled (includes the prompt's prefill).
- prefill tok/s: prompt tokens / TTFT.
- decode tok/s: one stream's (tokens - 1) / (last token - first token).
- per-token latency: gaps between one stream's consecutive tokens (inter-arrival, as a user sees).
- steady per-token latency: only the gaps that lie wholly in the steady state (below). The streams
  start together, so until the last one has its first token the others' gaps include the prompts
  still being prefilled; a route that runs prefill chunks between decode steps (meshnet's
  workers) shows that as a tail of long gaps, one that prefills every prompt first (the
  in-process lanes) as a longer TTFT instead. The steady figure compares the decode itself.
- aggregate tok/s: every generated token / the run's wall time (prefill included).
- aggregate decode tok/s: tokens stamped in the steady state, while all streams are decoding
  (from the last stream's first token to the first stream's last token) / that window.
Rates are medians over interleaved rounds; latency percentiles pool every round's samples.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from meshnet.bench.results import Measures


@dataclass(frozen=True)
class RequestTrace:
    prompt_index: int
    prompt_tokens: int
    started: float
    token_times: tuple[float, ...]
    tokens: tuple[int, ...]
    finished: float
    error: str | None = None


@dataclass(frozen=True)
class RunRecord:
    """One lane at one concurrency, once: ``len(requests)`` streams started together."""

    concurrency: int
    started: float
    finished: float
    requests: tuple[RequestTrace, ...]
    batch_occupancy: float | None = None
    """Mean decode steps per engine batch over the run (workers' ``batch_occupancy``)."""
    seam_messages: int | None = None
    """gRPC messages the route's shards sent each other during the run (workers'
    ``seam_messages_total``, read before and after); None for lanes without seams between processes."""
    seam_rows: int | None = None
    """Session rows those messages carried (workers' ``seam_rows_total``): equal to the messages
    on a session's own streams, more where a ring batch carried several sessions' rows."""


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else None


def median(values: Sequence[float]) -> float | None:
    return percentile(values, 50.0)


def _ok(run: RunRecord) -> list[RequestTrace]:
    return [r for r in run.requests if r.error is None and r.token_times]


def stream_decode_rate(trace: RequestTrace) -> float | None:
    times = trace.token_times
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return (len(times) - 1) / (times[-1] - times[0])


def token_gaps(trace: RequestTrace) -> list[float]:
    return [b - a for a, b in _consecutive_tokens(trace)]


def _consecutive_tokens(trace: RequestTrace) -> Iterator[tuple[float, float]]:
    """The arrival times of each token and the next, pairwise."""
    return zip(trace.token_times, trace.token_times[1:], strict=False)


def aggregate_rate(run: RunRecord) -> float | None:
    traces = _ok(run)
    wall = run.finished - run.started
    return sum(len(t.tokens) for t in traces) / wall if traces and wall > 0 else None


def steady_window(traces: Sequence[RequestTrace]) -> tuple[float, float]:
    """From the last stream's first token to the first stream's last token: every stream decodes."""
    return max(t.token_times[0] for t in traces), min(t.token_times[-1] for t in traces)


def steady_token_gaps(run: RunRecord) -> list[float]:
    """The token gaps of every stream that lie wholly inside the run's steady window."""
    traces = _ok(run)
    if not traces:
        return []
    start, stop = steady_window(traces)
    pairs = (pair for t in traces for pair in _consecutive_tokens(t))
    return [b - a for a, b in pairs if start <= a and b <= stop]


def steady_state_rate(run: RunRecord) -> float | None:
    """Tokens per second while every stream is decoding; falls back to the decode span when the
    streams barely overlap (fewer than two tokens per stream inside the window)."""
    traces = _ok(run)
    if not traces:
        return None
    start, stop = steady_window(traces)
    count = sum(1 for t in traces for stamp in t.token_times if start < stamp <= stop)
    if stop > start and count >= 2 * len(traces):
        return count / (stop - start)
    first = min(t.token_times[0] for t in traces)
    last = max(t.token_times[-1] for t in traces)
    decoded = sum(len(t.token_times) - 1 for t in traces)
    return decoded / (last - first) if last > first and decoded else None


@dataclass(frozen=True)
class RoundValues:
    """One run reduced to the numbers compared across lanes round by round."""

    ttft_ms: float | None
    prefill_tok_s: float | None
    decode_tok_s: float | None
    aggregate_tok_s: float | None
    aggregate_decode_tok_s: float | None


def round_values(run: RunRecord) -> RoundValues:
    traces = _ok(run)
    ttfts = [t.token_times[0] - t.started for t in traces]
    prefill = [t.prompt_tokens / g for t, g in zip(traces, ttfts, strict=True) if g > 0]
    rates = [r for r in (stream_decode_rate(t) for t in traces) if r is not None]
    ttft = median(ttfts)
    return RoundValues(
        ttft_ms=None if ttft is None else ttft * 1000.0,
        prefill_tok_s=median(prefill),
        decode_tok_s=median(rates),
        aggregate_tok_s=aggregate_rate(run),
        aggregate_decode_tok_s=steady_state_rate(run),
    )


PAIRED_METRICS = ("decode_tok_s", "prefill_tok_s", "aggregate_tok_s", "aggregate_decode_tok_s")


def summarize(rounds: Sequence[RunRecord | None], reference: Sequence[RunRecord | None] = ()) -> Measures:
    """Metrics of one lane at one concurrency over its rounds (None: the lane missed that round).

    ``reference`` holds the reference lane's run of the same round, index for index: the
    ``vs_reference`` ratios are medians of per-round ratios, so slow drift of a shared machine
    cancels out instead of landing on whichever lane ran during a busy minute.
    """
    runs = [run for run in rounds if run is not None]
    per_round = [round_values(run) for run in runs]
    gaps = [g * 1000.0 for run in runs for t in _ok(run) for g in token_gaps(t)]
    steady = [g * 1000.0 for run in runs for g in steady_token_gaps(run)]
    latencies = [(t.finished - t.started) * 1000.0 for run in runs for t in _ok(run)]
    errors = [r.error for run in runs for r in run.requests if r.error is not None]

    def rounds_of(name: str) -> list[float]:
        return [v for v in (getattr(r, name) for r in per_round) if v is not None]

    return Measures(
        concurrency=runs[0].concurrency if runs else 1,
        rounds=len(runs),
        requests=sum(len(run.requests) for run in runs),
        failures=len(errors),
        errors=tuple(sorted(set(errors))[:5]),
        ttft_ms=median(rounds_of("ttft_ms")),
        prefill_tok_s=median(rounds_of("prefill_tok_s")),
        decode_tok_s=median(rounds_of("decode_tok_s")),
        token_latency_ms_p50=percentile(gaps, 50.0),
        token_latency_ms_p95=percentile(gaps, 95.0),
        steady_token_latency_ms_p50=percentile(steady, 50.0),
        steady_token_latency_ms_p95=percentile(steady, 95.0),
        request_latency_ms_p50=percentile(latencies, 50.0),
        request_latency_ms_p95=percentile(latencies, 95.0),
        aggregate_tok_s=median(rounds_of("aggregate_tok_s")),
        aggregate_decode_tok_s=median(rounds_of("aggregate_decode_tok_s")),
        aggregate_decode_tok_s_rounds=tuple(rounds_of("aggregate_decode_tok_s")),
        batch_occupancy=median([run.batch_occupancy for run in runs if run.batch_occupancy is not None]),
        seam_messages_per_token=median([v for v in (seam_messages_per_token(run) for run in runs) if v is not None]),
        vs_reference=paired_ratios(rounds, reference),
    )


def seam_messages_per_token(run: RunRecord) -> float | None:
    """Seam messages of the run per token its streams received: both counted, neither derived.

    The count covers the whole run, prefill included: a one-chunk prompt crosses the seams
    like a decode step (its frame on, the first token back round the ring), so with such
    prompts the figure is the decode steps' own; each further chunk adds its frames."""
    tokens = sum(len(t.tokens) for t in run.requests)
    if run.seam_messages is None or not tokens:
        return None
    return run.seam_messages / tokens


def paired_ratios(rounds: Sequence[RunRecord | None], reference: Sequence[RunRecord | None]) -> dict[str, float | None]:
    """For each rate: the median over rounds of (this lane's value / the reference's, same round)."""
    pairs = [(round_values(a), round_values(b)) for a, b in zip(rounds, reference, strict=False) if a and b]
    return {
        name: paired_ratio([getattr(mine, name) for mine, _ in pairs], [getattr(theirs, name) for _, theirs in pairs])
        for name in PAIRED_METRICS
    }


def paired_ratio(values: Sequence[float | None], reference: Sequence[float | None]) -> float | None:
    """Median over rounds of value / reference, for the rounds where both were measured."""
    ratios = [v / r for v, r in zip(values, reference, strict=False) if v is not None and r]
    return median(ratios)


@dataclass(frozen=True)
class Agreement:
    token_agreement: float | None
    """Fraction of compared positions whose token equals the reference's."""
    compared_tokens: int
    first_divergence: int | None
    """Index (among generated tokens) of the first mismatch in any stream, or None."""


def token_agreement(runs: Sequence[RunRecord], reference: dict[int, tuple[int, ...]]) -> Agreement:
    """Compare every stream of every run with the reference tokens for its prompt (greedy)."""
    same = total = 0
    first: int | None = None
    for run in runs:
        for trace in _ok(run):
            expected = reference.get(trace.prompt_index)
            if expected is None:
                continue
            for index, (a, b) in enumerate(zip(trace.tokens, expected, strict=False)):
                total += 1
                same += a == b
                if a != b and (first is None or index < first):
                    first = index
    return Agreement(same / total if total else None, total, first)
