"""The load generator's histograms: percentiles within their 1% buckets, and exact merging."""

from __future__ import annotations

import random

import pytest

from meshnet.membership.load_figures import from_json, histogram, merged, percentile, summary, to_json


@pytest.mark.parametrize("seed", range(20))
def test_a_percentile_is_within_one_bucket_of_the_samples_own(seed: int) -> None:
    rng = random.Random(seed)
    values = [rng.lognormvariate(0, 2) for _ in range(rng.randint(1, 3000))]
    counts = histogram(values)
    for fraction in (0.5, 0.99):
        exact = sorted(values)[max(1, -(-len(values) * int(fraction * 100) // 100)) - 1]
        read = percentile(counts, fraction)
        assert read is not None
        assert exact <= read * 1.0001 and read <= max(exact, 0.001) * 1.0101


def test_histograms_of_parts_merge_into_the_histogram_of_the_whole() -> None:
    rng = random.Random(7)
    first = [rng.uniform(0.1, 50) for _ in range(500)]
    second = [rng.uniform(10, 2000) for _ in range(300)]
    parts = [from_json(to_json(histogram(first))), from_json(to_json(histogram(second)))]
    assert merged(parts) == histogram(first + second)
    whole = summary(merged(parts), span_s=10.0)
    assert whole["count"] == 800 and whole["per_s"] == 80.0
    assert whole["max_ms"] >= max(second)


def test_nothing_measured_reads_as_none() -> None:
    assert percentile(histogram([]), 0.99) is None
    assert summary(histogram([]), 1.0)["p50_ms"] is None
