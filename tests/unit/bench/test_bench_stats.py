"""Lane metrics from hand-built traces: rates, steady-state windows, paired ratios, agreement."""

from __future__ import annotations

import pytest

from meshnet.bench.config import BenchConfig, parse_lane
from meshnet.bench.context import clamp_contexts, estimate_seconds
from meshnet.bench.stats import (
    RequestTrace,
    RunRecord,
    steady_state_rate,
    steady_token_gaps,
    summarize,
    token_agreement,
)
from meshnet.core.errors import InvalidArgument


def trace(
    index: int, started: float, first: float, gap: float, count: int, tokens: tuple[int, ...] = ()
) -> RequestTrace:
    times = tuple(first + gap * i for i in range(count))
    return RequestTrace(index, 100, started, times, tokens or tuple(range(count)), times[-1])


def run(*traces: RequestTrace) -> RunRecord:
    return RunRecord(len(traces), min(t.started for t in traces), max(t.finished for t in traces), traces)


def test_single_stream_metrics() -> None:
    summary = summarize([run(trace(0, 0.0, 0.5, 0.01, 11))])
    assert summary.ttft_ms == pytest.approx(500.0)
    assert summary.prefill_tok_s == pytest.approx(200.0)
    assert summary.decode_tok_s == pytest.approx(100.0)
    assert summary.token_latency_ms_p50 == pytest.approx(10.0)
    assert summary.aggregate_tok_s == pytest.approx(11 / 0.6)


def test_steady_state_window_counts_only_while_every_stream_decodes() -> None:
    # Stream b starts decoding at 1.0 and a stops at 2.0: only (1.0, 2.0] is steady state.
    a = trace(0, 0.0, 0.1, 0.1, 20)  # tokens at 0.1 .. 2.0
    b = trace(1, 0.0, 1.0, 0.05, 40)  # tokens at 1.0 .. 2.95
    rate = steady_state_rate(run(a, b))
    assert rate == pytest.approx((10 + 20) / 1.0, rel=0.05)


def test_paired_ratios_are_medians_of_per_round_ratios() -> None:
    lane = [run(trace(0, 0.0, 0.1, 0.02, 11)), None, run(trace(0, 0.0, 0.1, 0.01, 11))]
    reference = [run(trace(0, 0.0, 0.1, 0.01, 11)) for _ in range(3)]
    summary = summarize(lane, reference)
    assert summary.rounds == 2
    assert summary.vs_reference["decode_tok_s"] == pytest.approx(0.75)


def test_failed_requests_are_counted_not_measured() -> None:
    broken = RequestTrace(0, 100, 0.0, (), (), 1.0, "unavailable: gone")
    summary = summarize([run(trace(1, 0.0, 0.1, 0.01, 5), broken)])
    assert summary.failures == 1 and summary.errors == ("unavailable: gone",)
    assert summary.decode_tok_s == pytest.approx(100.0)


def test_token_agreement_finds_the_first_divergence() -> None:
    reference = {0: (1, 2, 3, 4), 1: (5, 6, 7, 8)}
    runs = [run(trace(0, 0, 1, 1, 4, (1, 2, 3, 4)), trace(1, 0, 1, 1, 4, (5, 6, 9, 9)))]
    agreement = token_agreement(runs, reference)
    assert agreement.token_agreement == pytest.approx(6 / 8)
    assert agreement.first_divergence == 2 and agreement.compared_tokens == 8


def test_lane_names_and_config_checks() -> None:
    assert str(parse_lane("meshnet-3")) == "meshnet-3" and parse_lane("recompute").shards == 3
    with pytest.raises(InvalidArgument, match="unknown lane"):
        parse_lane("meshnet")
    with pytest.raises(InvalidArgument, match="concurrency"):
        BenchConfig(model=__file__, data_dir=".", concurrency=(1, 16))  # type: ignore[arg-type]
    config = BenchConfig(model=__file__, data_dir=".")  # type: ignore[arg-type]
    assert config.measures(parse_lane("meshnet-3"), 8) and not config.measures(parse_lane("split-2"), 8)
    # meshnet-2 is measured at the top concurrency too: issue 15 judges the pinned route at 8.
    assert config.measures(parse_lane("meshnet-2"), 8) and not config.measures(parse_lane("meshnet-1"), 8)
    assert not config.measures(parse_lane("meshnet-2"), 2) and config.measures(parse_lane("meshnet-3"), 2)
    assert config.measures(parse_lane("meshnet-2"), 4) and not config.measures(parse_lane("recompute"), 4)
    with pytest.raises(InvalidArgument, match="prefill_lane a meshnet-N lane"):
        BenchConfig(model=__file__, data_dir=".", prefill_lane="split-2")  # type: ignore[arg-type]


def test_contexts_are_clamped_to_the_room_and_prefill_cost_is_extrapolated() -> None:
    assert clamp_contexts([128, 2048, 8000, 9000, 9500], 8192, 8) == [128, 2048, 8000, 8182]
    assert estimate_seconds(None, 8000) == 0.0
    assert estimate_seconds((2048, 20.0), 8000) == pytest.approx(20.0 * (8000 / 2048) ** 1.75)


def test_steady_token_latency_leaves_out_the_gaps_while_prompts_still_prefill() -> None:
    # a decodes every 0.1 s from 0.1, but waits 1.0 s at 0.5 while b's prompt prefills (a route
    # that runs prefill chunks between decode steps); b's first token comes at 1.6.
    early = (0.1, 0.2, 0.3, 0.4, 0.5, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0, 2.1, 2.2)
    a = RequestTrace(0, 100, 0.0, early, tuple(range(len(early))), early[-1])
    b = trace(1, 0.0, 1.6, 0.1, 7)  # 1.6 .. 2.2
    summary = summarize([run(a, b)])
    assert summary.token_latency_ms_p95 is not None and summary.token_latency_ms_p95 > 150.0  # the one 1 s gap of 18
    assert summary.steady_token_latency_ms_p50 == pytest.approx(100.0)
    assert summary.steady_token_latency_ms_p95 == pytest.approx(100.0)
    assert steady_token_gaps(run(a, b)) == pytest.approx([0.1] * 12)


def test_without_an_overlap_there_are_no_steady_gaps() -> None:
    a, b = trace(0, 0.0, 0.1, 0.1, 3), trace(1, 0.0, 1.0, 0.1, 3)  # a ends before b starts
    assert steady_token_gaps(run(a, b)) == []
    assert summarize([run(a, b)]).steady_token_latency_ms_p95 is None
