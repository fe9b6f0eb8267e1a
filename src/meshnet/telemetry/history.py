"""Live history for the operator view: bounded ring buffers of time buckets, per named series.

A ``Series`` keeps the last ``bucket_count`` buckets of ``bucket_seconds`` each (by default ten
minutes in 5 s buckets) and folds every value observed in a bucket into its count, sum and
maximum, so memory is fixed whatever the traffic. A ``History`` holds series by (metric, label)
and bounds the number of labels per metric (node ids come and go): the least recently updated
label is dropped first. Time is always passed in, so tests drive a clock instead of sleeping.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class HistoryShape:
    """How much history is kept: ``bucket_count`` buckets of ``bucket_seconds`` each."""

    bucket_seconds: float = 5.0
    bucket_count: int = 120
    max_labels: int = 32
    """Labels (node ids, hop indexes) kept per metric; the least recently updated goes first."""


@dataclass(frozen=True)
class Point:
    """One bucket of a series: its start (same clock as the observations) and what fell in it."""

    at: float
    count: int
    total: float
    peak: float

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def as_json(self) -> dict[str, float]:
        return {"at": round(self.at, 3), "count": self.count, "mean": round(self.mean, 6), "max": round(self.peak, 6)}


class Series:
    """A ring of ``bucket_count`` buckets; a bucket is reused once its time has passed."""

    def __init__(self, shape: HistoryShape) -> None:
        self._shape = shape
        self._index: list[int] = [-1] * shape.bucket_count
        """The absolute bucket number each slot holds (-1: never used)."""
        self._count = [0] * shape.bucket_count
        self._total = [0.0] * shape.bucket_count
        self._peak = [0.0] * shape.bucket_count

    def add(self, value: float, now: float) -> None:
        if not math.isfinite(value):
            return
        number = math.floor(now / self._shape.bucket_seconds)
        slot = number % self._shape.bucket_count
        if self._index[slot] != number:
            self._index[slot], self._count[slot], self._total[slot], self._peak[slot] = number, 0, 0.0, value
        self._count[slot] += 1
        self._total[slot] += value
        self._peak[slot] = max(self._peak[slot], value)

    def points(self, now: float) -> list[Point]:
        """The buckets within the kept window that saw a value, oldest first."""
        newest = math.floor(now / self._shape.bucket_seconds)
        oldest = newest - self._shape.bucket_count + 1
        kept = [
            Point(number * self._shape.bucket_seconds, self._count[slot], self._total[slot], self._peak[slot])
            for slot, number in enumerate(self._index)
            if oldest <= number <= newest and self._count[slot]
        ]
        return sorted(kept, key=lambda point: point.at)


class History:
    """Series by metric and label, each metric bounded to ``max_labels`` labels."""

    def __init__(self, shape: HistoryShape) -> None:
        self.shape = shape
        self._metrics: dict[str, OrderedDict[str, Series]] = {}

    def add(self, metric: str, value: float, now: float, label: str = "") -> None:
        labels = self._metrics.setdefault(metric, OrderedDict())
        series = labels.get(label)
        if series is None:
            while len(labels) >= self.shape.max_labels:
                labels.popitem(last=False)
            series = labels[label] = Series(self.shape)
        labels.move_to_end(label)
        series.add(value, now)

    def latest(self, metric: str, now: float) -> dict[str, float]:
        """Per label of ``metric``, the mean of its newest bucket still in the window."""
        latest = {}
        for label, series in self._metrics.get(metric, {}).items():
            points = series.points(now)
            if points:
                latest[label] = points[-1].mean
        return latest

    def as_json(self, now: float) -> dict[str, object]:
        """``{"bucket_seconds", "window_seconds", "now", "series": {metric: {label: [point...]}}}``."""
        series = {
            metric: {label: [p.as_json() for p in one.points(now)] for label, one in sorted(labels.items())}
            for metric, labels in sorted(self._metrics.items())
        }
        return {
            "bucket_seconds": self.shape.bucket_seconds,
            "window_seconds": self.shape.bucket_seconds * self.shape.bucket_count,
            "now": round(now, 3),
            "series": series,
        }
