"""What the tracker logs about disputed work records: the first dispute of each reporter in a
window at once, the rest as one summary line per reporter when the window closes.

A gateway whose records all fail a check (a misconfigured one, or every record of the
tracker-scale bench) would otherwise write a warning per record and flood the log. Each dispute
is still stored with its reason (``store.record_judged_work``); this only decides the log lines.
Pure: the caller keeps the ``DisputeWindow`` and reads the clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

SUMMARY_INTERVAL_S = 60.0
"""Seconds a window runs from its first dispute before its summary lines are logged."""

UNAUTHENTICATED = "an unauthenticated caller"
"""The reporter a plaintext tracker knows nobody by."""


@dataclass(frozen=True)
class ReporterDisputes:
    count: int
    """Disputes of this reporter in the window, its first (logged at once) included."""
    last_reason: str


@dataclass(frozen=True)
class DisputeWindow:
    started_at: float | None = None
    """When its first dispute came (wall seconds); None: the window is empty."""
    reporters: Mapping[str, ReporterDisputes] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class DisputeSummary:
    """One line for the log: ``more`` disputes of ``reporter`` beyond the one logged at once."""

    reporter: str
    more: int
    last_reason: str
    window_s: float

    def line(self) -> str:
        return (
            f"{self.more} more work records from {self.reporter} disputed in the last {self.window_s:.0f} s "
            f"(the last: {self.last_reason})"
        )


def note_dispute(window: DisputeWindow, reporter: str | None, reason: str, now: float) -> tuple[DisputeWindow, bool]:
    """``window`` with one more dispute of ``reporter``, and whether to log this one at once
    (the reporter's first in the window)."""
    name = UNAUTHENTICATED if reporter is None else reporter
    seen = window.reporters.get(name)
    count = 1 if seen is None else seen.count + 1
    reporters = MappingProxyType({**window.reporters, name: ReporterDisputes(count, reason)})
    started_at = now if window.started_at is None else window.started_at
    return replace(window, started_at=started_at, reporters=reporters), seen is None


def close_due(
    window: DisputeWindow, now: float, interval_s: float = SUMMARY_INTERVAL_S
) -> tuple[DisputeWindow, tuple[DisputeSummary, ...]]:
    """If ``window`` ran ``interval_s`` (or the clock went back past its start): an empty window
    and a summary per reporter with disputes not yet logged; else ``window`` and none."""
    started = window.started_at
    if started is None or started <= now < started + interval_s:
        return window, ()
    summaries = tuple(
        DisputeSummary(reporter, seen.count - 1, seen.last_reason, max(0.0, now - started))
        for reporter, seen in sorted(window.reporters.items())
        if seen.count > 1
    )
    return DisputeWindow(), summaries
