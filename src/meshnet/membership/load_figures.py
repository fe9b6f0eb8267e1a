"""The load generator's figures: latency histograms that merge across processes, and CPU meters.

A latency is counted in a logarithmic bucket 1% wide (``BUCKET_RATIO``), so a run's figures are
a few hundred numbers whatever its length (a 30-minute soak at 3,000 nodes has millions of
heartbeats), histograms of several generator processes add up exactly, and a percentile read
from one is within 1% of the sample's own.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import psutil

BUCKET_RATIO = 1.01
FLOOR_MS = 0.001
"""Latencies below this are counted at it (a microsecond: below anything a gRPC call takes)."""

Histogram = Counter[int]


def bucket(value_ms: float) -> int:
    return max(0, math.ceil(math.log(max(value_ms, FLOOR_MS) / FLOOR_MS, BUCKET_RATIO)))


def bucket_ms(index: int) -> float:
    """The upper edge of bucket ``index``: what a percentile falling in it reads."""
    return FLOOR_MS * BUCKET_RATIO**index


def histogram(values_ms: Iterable[float]) -> Histogram:
    return Counter(bucket(value) for value in values_ms)


def merged(histograms: Iterable[Mapping[int, int]]) -> Histogram:
    total: Histogram = Counter()
    for one in histograms:
        total.update(one)
    return total


def percentile(counts: Mapping[int, int], fraction: float) -> float | None:
    """The nearest-rank percentile (``fraction`` in [0, 1]) of a histogram; None when empty."""
    total = sum(counts.values())
    if total == 0:
        return None
    rank = min(total, max(1, math.ceil(round(fraction * total, 9))))
    seen = 0
    for index in sorted(counts):
        seen += counts[index]
        if seen >= rank:
            return round(bucket_ms(index), 3)
    return None  # unreachable: the ranks add up to total


def summary(counts: Mapping[int, int], span_s: float) -> dict[str, Any]:
    """Count, rate and percentiles of one call's latencies over ``span_s``."""
    total = sum(counts.values())
    return {
        "count": total,
        "per_s": round(total / span_s, 2) if span_s > 0 else None,
        "p50_ms": percentile(counts, 0.50),
        "p99_ms": percentile(counts, 0.99),
        "max_ms": round(bucket_ms(max(counts)), 3) if counts else None,
    }


def to_json(counts: Mapping[int, int]) -> dict[str, int]:
    return {str(index): count for index, count in sorted(counts.items())}


def from_json(document: Mapping[str, int]) -> Histogram:
    return Counter({int(index): int(count) for index, count in document.items()})


class ProcessMeter:
    """CPU (in cores) and peak RSS of one process from now on."""

    def __init__(self, pid: int | None) -> None:
        self._process = None if pid is None else psutil.Process(pid)
        self._cpu = self._cpu_s()
        self._started = time.monotonic()
        self.peak_rss_bytes = 0

    def _cpu_s(self) -> float:
        if self._process is None:
            return 0.0
        times = self._process.cpu_times()
        return float(times.user + times.system)

    def sample(self) -> None:
        if self._process is not None:
            self.peak_rss_bytes = max(self.peak_rss_bytes, int(self._process.memory_info().rss))

    def cores(self) -> float | None:
        if self._process is None:
            return None
        return round((self._cpu_s() - self._cpu) / (time.monotonic() - self._started), 3)
