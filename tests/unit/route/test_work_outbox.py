"""Work records survive the gateway: written ahead to the outbox, replayed by the next process,
removed once acknowledged; a request cut off mid-way leaves an ``unverified`` record."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from work_samples import record

from meshnet.core.errors import FailedPrecondition, Unavailable
from meshnet.core.ids import RequestId
from meshnet.core.tracking import WorkRecord
from meshnet.route.outbox import WorkOutbox
from meshnet.route.work_reports import ReportPolicy, WorkReporter

FAST = ReportPolicy(timeout_s=0.1, backoff_s=(0.01, 0.02), drain_s=0.5)


@dataclass
class Tracker:
    """Stores each request id once, like the real store; ``down`` refuses to answer."""

    down: bool = False
    stored: dict[str, WorkRecord] = field(default_factory=dict)

    async def report_work(self, sent: WorkRecord, *, timeout_s: float | None = None) -> object:
        if self.down:
            raise Unavailable("tracker unreachable")
        self.stored.setdefault(sent.request_id, sent)
        return None


def test_records_round_trip_through_the_outbox_and_it_is_exclusive(tmp_path: Path) -> None:
    outbox = WorkOutbox(tmp_path / "outbox.sqlite3")
    outbox.put(record("a", "unverified", 0))
    outbox.put(record("b"))
    outbox.put(record("a"))  # the final record replaces the provisional one
    with pytest.raises(FailedPrecondition, match="another gateway"):
        WorkOutbox(tmp_path / "outbox.sqlite3")
    outbox.close()
    reopened = WorkOutbox(tmp_path / "outbox.sqlite3")
    assert reopened.pending() == [record("a"), record("b")]
    reopened.remove(RequestId("a"))
    assert reopened.pending() == [record("b")]
    reopened.close()


async def test_records_queued_while_the_tracker_is_down_arrive_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite3"
    tracker = Tracker(down=True)
    first = WorkReporter(tracker, FAST, WorkOutbox(path))
    await first.write_ahead(record("done", "unverified", 0))
    first.file(record("done"))
    await first.write_ahead(record("cut-off", "unverified", 0))  # the process dies before it ends
    await first.drain()
    first._outbox.close()  # type: ignore[union-attr]
    tracker.down = False
    second = WorkReporter(tracker, FAST, WorkOutbox(path))
    assert second.replay() == 2
    await second.drain()
    assert tracker.stored == {"done": record("done"), "cut-off": record("cut-off", "unverified", 0)}
    assert second._outbox.pending() == []  # type: ignore[union-attr]


async def test_a_replayed_record_the_tracker_already_has_is_stored_once(tmp_path: Path) -> None:
    tracker = Tracker()
    outbox = WorkOutbox(tmp_path / "outbox.sqlite3")
    reporter = WorkReporter(tracker, FAST, outbox)
    reporter.file(record("r"))
    await reporter.drain()
    outbox.put(record("r"))  # as if the process died between the acknowledgement and the removal
    assert reporter.replay() == 1
    await reporter.drain()
    assert list(tracker.stored) == ["r"] and outbox.pending() == []


async def test_cancelling_the_drain_still_leaves_the_record_on_disk(tmp_path: Path) -> None:
    outbox = WorkOutbox(tmp_path / "outbox.sqlite3")
    reporter = WorkReporter(Tracker(down=True), FAST, outbox)
    reporter.file(record("late"))
    await asyncio.sleep(0)
    await reporter.drain(timeout_s=0.0)
    assert outbox.pending() == [record("late")]
