"""Latency histograms in Prometheus' shape: cumulative ``le`` buckets, a sum and a count, in seconds.

A ``Histogram`` is plain data owned by one component (no global registry); ``telemetry.prometheus``
exposes it. Labels are bounded: past ``max_series`` label values, new ones fold into ``"other"``,
so a churn of node ids can never grow the exposition without limit.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

LATENCY_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds in seconds, from a fast token (5 ms) to a long prefill (a minute)."""
OTHER = "other"


@dataclass(frozen=True)
class HistogramSeries:
    """One label value's figures: cumulative counts per upper bound (``+Inf`` last), sum, count."""

    label: str
    cumulative: tuple[tuple[str, int], ...]
    total: float
    count: int


class Histogram:
    """Observations in seconds by one optional label, with bounded label cardinality."""

    def __init__(
        self,
        name: str,
        help_text: str,
        *,
        label: str = "",
        buckets: tuple[float, ...] = LATENCY_BUCKETS,
        max_series: int = 32,
    ) -> None:
        self.name = name
        self.help_text = help_text
        self.label = label
        self._bounds = tuple(sorted(buckets))
        self._max_series = max_series
        self._counts: dict[str, list[int]] = {}
        self._sums: dict[str, float] = {}

    def observe(self, seconds: float, label: str = "") -> None:
        if not math.isfinite(seconds) or seconds < 0:
            return
        if label not in self._counts and len(self._counts) >= self._max_series:
            label = OTHER
        counts = self._counts.setdefault(label, [0] * (len(self._bounds) + 1))
        counts[bisect.bisect_left(self._bounds, seconds)] += 1
        self._sums[label] = self._sums.get(label, 0.0) + seconds

    def series(self) -> list[HistogramSeries]:
        """Every label's cumulative buckets, ``le`` formatted as Prometheus writes floats."""
        out = []
        for label, counts in sorted(self._counts.items()):
            running, cumulative = 0, []
            for bound, count in zip((*self._bounds, math.inf), counts, strict=True):
                running += count
                cumulative.append(("+Inf" if math.isinf(bound) else repr(float(bound)), running))
            out.append(HistogramSeries(label, tuple(cumulative), self._sums[label], running))
        return out
