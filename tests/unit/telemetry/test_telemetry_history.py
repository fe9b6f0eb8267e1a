"""The operator view's ring buffers and latency histograms, driven by a hand-set clock."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from meshnet.telemetry.histogram import OTHER, Histogram
from meshnet.telemetry.history import History, HistoryShape, Series
from meshnet.telemetry.prometheus import build_registry, render


def test_a_series_folds_values_per_bucket_and_forgets_what_left_the_window() -> None:
    series = Series(HistoryShape(bucket_seconds=5.0, bucket_count=4))
    series.add(2.0, now=1.0)
    series.add(4.0, now=4.9)
    series.add(10.0, now=5.0)
    points = series.points(now=6.0)
    assert [(p.at, p.count, p.mean, p.peak) for p in points] == [(0.0, 2, 3.0, 4.0), (5.0, 1, 10.0, 10.0)]
    # 4 buckets of 5 s: at t=21 the window is [5, 25), so [0, 5) has left it; at t=25 [5, 10) too.
    assert [p.at for p in series.points(now=21.0)] == [5.0]
    assert [p.at for p in series.points(now=25.0)] == []
    # Bucket [20, 25) reuses the slot of [0, 5): a fresh count, never mixed with the old one.
    series.add(1.0, now=20.5)
    assert [(p.at, p.count, p.mean) for p in series.points(now=21.0)] == [(5.0, 1, 10.0), (20.0, 1, 1.0)]
    series.add(math.nan, now=21.0)
    assert series.points(now=21.0)[1].count == 1


def test_history_bounds_labels_per_metric_dropping_the_least_recently_updated() -> None:
    history = History(HistoryShape(bucket_seconds=1.0, bucket_count=10, max_labels=2))
    history.add("decode_tokens_per_s", 10.0, 0.5, "a")
    history.add("decode_tokens_per_s", 20.0, 0.5, "b")
    history.add("decode_tokens_per_s", 11.0, 1.5, "a")
    history.add("decode_tokens_per_s", 30.0, 1.5, "c")  # b is the stalest: dropped
    document = history.as_json(2.0)
    assert document["window_seconds"] == 10.0
    series = document["series"]["decode_tokens_per_s"]  # type: ignore[index]
    assert sorted(series) == ["a", "c"]
    assert [p["mean"] for p in series["a"]] == [10.0, 11.0]


def test_histogram_buckets_are_cumulative_with_sum_count_and_bounded_labels() -> None:
    histogram = Histogram("hop_seconds", "per hop", label="node", buckets=(0.1, 1.0), max_series=2)
    for seconds, node in [(0.05, "a"), (0.1, "a"), (0.5, "a"), (3.0, "a"), (0.2, "b"), (0.2, "c"), (-1.0, "a")]:
        histogram.observe(seconds, node)
    by_label = {s.label: s for s in histogram.series()}
    assert sorted(by_label) == ["a", "b", OTHER]
    a = by_label["a"]
    # le is inclusive (Prometheus): 0.1 falls in the 0.1 bucket; a negative value is ignored.
    assert a.cumulative == (("0.1", 2), ("1.0", 3), ("+Inf", 4))
    assert (a.count, round(a.total, 6)) == (4, 3.65)


def test_the_exposition_parses_as_prometheus_histograms() -> None:
    histogram = Histogram("time_to_first_token_seconds", "ttft", buckets=(0.5, 1.0))
    histogram.observe(0.3)
    histogram.observe(0.7)
    labelled = Histogram("request_duration_seconds", "by outcome", label="outcome", buckets=(1.0,))
    labelled.observe(2.0, "completed")
    registry = build_registry("meshnet_gateway", lambda: {"admitted_total": 2.0}, histograms=[histogram, labelled])
    families = {f.name: f for f in text_string_to_metric_families(render(registry).decode())}
    ttft = families["meshnet_gateway_time_to_first_token_seconds"]
    assert ttft.type == "histogram"
    samples = {(s.name, s.labels.get("le")): s.value for s in ttft.samples}
    assert samples[("meshnet_gateway_time_to_first_token_seconds_bucket", "0.5")] == 1
    assert samples[("meshnet_gateway_time_to_first_token_seconds_bucket", "+Inf")] == 2
    assert samples[("meshnet_gateway_time_to_first_token_seconds_count", None)] == 2
    assert math.isclose(samples[("meshnet_gateway_time_to_first_token_seconds_sum", None)], 1.0)
    outcome = families["meshnet_gateway_request_duration_seconds"]
    assert {s.labels.get("outcome") for s in outcome.samples} == {"completed"}
    assert families["meshnet_gateway_admitted"].type == "counter"
