"""Disputed work records in the tracker's log: the first of each reporter in a window at once,
the rest as one summary line per reporter when the window closes; every dispute still stored.

The pure rules (``tracker.dispute_log``) are checked against counts written out by hand; the
``CheckedWork`` test runs the real ledger and a real SQLite store, and counts the log lines.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.tracking import NodeWork, WorkRecord
from meshnet.tracker.checked_work import CheckedWork
from meshnet.tracker.dispute_log import DisputeSummary, DisputeWindow, close_due, note_dispute
from meshnet.tracker.store import SqliteTrackerStore
from meshnet.tracker.work_checks import WorkLedger

T0 = 1_000_000.0


def test_a_reporters_first_dispute_is_logged_at_once_and_the_rest_wait_for_the_summary() -> None:
    window = DisputeWindow()
    firsts = []
    for at, reporter in [(0, "g-1"), (1, "g-1"), (2, "g-2"), (3, "g-1"), (4, None)]:
        window, first = note_dispute(window, reporter, f"reason {at}", T0 + at)
        firsts.append(first)
    assert firsts == [True, False, True, False, True]
    assert window.started_at == T0
    assert {name: seen.count for name, seen in window.reporters.items()} == {
        "g-1": 3,
        "g-2": 1,
        "an unauthenticated caller": 1,
    }


def test_a_window_closes_after_its_interval_with_one_line_per_reporter_with_more() -> None:
    window = DisputeWindow()
    for at, reporter in [(0, "g-2"), (1, "g-1"), (2, "g-2"), (3, "g-2"), (5, "g-3")]:
        window, _ = note_dispute(window, reporter, f"reason {at}", T0 + at)
    assert close_due(window, T0 + 59.9, interval_s=60.0) == (window, ())
    emptied, summaries = close_due(window, T0 + 60.0, interval_s=60.0)
    assert emptied == DisputeWindow()
    # g-1 and g-3 had one dispute each, logged at once: nothing more to say about them.
    assert summaries == (DisputeSummary("g-2", 2, "reason 3", 60.0),)
    assert summaries[0].line() == "2 more work records from g-2 disputed in the last 60 s (the last: reason 3)"


def test_an_empty_window_never_closes_and_a_clock_gone_back_closes_it() -> None:
    assert close_due(DisputeWindow(), T0 + 1e9) == (DisputeWindow(), ())
    window, _ = note_dispute(DisputeWindow(), "g-1", "r", T0)
    window, _ = note_dispute(window, "g-1", "r", T0)
    assert close_due(window, T0 - 5.0, interval_s=60.0)[1] == (DisputeSummary("g-1", 1, "r", 0.0),)


def unrouted(number: int) -> WorkRecord:
    """A record of a session this tracker never routed: disputed ("no route was issued")."""
    return WorkRecord(
        request_id=RequestId(f"req-{number}"),
        model="tiny",
        status="completed",
        tokens_in=3,
        tokens_out=5,
        attribution=(NodeWork(NodeId("head"), LayerRange(0, 8), 8),),
        billing_units=0.01,
        started_at=T0 + 1,
        finished_at=T0 + 2,
        session_id=SessionId(f"s-{number}"),
    )


async def test_a_flood_of_disputes_logs_two_lines_per_reporter_and_stores_every_dispute(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = [T0]
    store = SqliteTrackerStore(tmp_path / "tracker.sqlite3")

    async def call(function: Callable[..., Any], *args: Any) -> Any:  # the store thread, inline
        return function(*args)

    ledger = WorkLedger(grace_s=5.0, wall_clock=lambda: now[0])
    work = CheckedWork(ledger, store, call, lambda node: True, lambda: now[0])
    reporters = ["g-1"] * 40 + ["g-2"] * 3
    with caplog.at_level(logging.WARNING, logger="meshnet.tracker.checked_work"):
        for number, reporter in enumerate(reporters):
            now[0] = T0 + number  # one a second: the window (60 s) holds them all
            assert not (await work.report(unrouted(number), reporter)).duplicate
        at_once = [entry.getMessage() for entry in caplog.records]
        now[0] = T0 + 100
        work.log_dispute_summaries()
    lines = [entry.getMessage() for entry in caplog.records]
    assert len(at_once) == 2 and "req-0 from g-1 disputed" in at_once[0] and "req-40 from g-2" in at_once[1]
    assert lines[2:] == [
        "39 more work records from g-1 disputed in the last 100 s (the last: no route was issued for session s-39)",
        "2 more work records from g-2 disputed in the last 100 s (the last: no route was issued for session s-42)",
    ]
    for number in range(len(reporters)):
        assert store.work_dispute(RequestId(f"req-{number}")) == f"no route was issued for session s-{number}"
    store.close()
