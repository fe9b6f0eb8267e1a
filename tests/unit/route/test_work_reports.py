"""A record leaves the gateway's outbox only through the tracker: acknowledged (removed) or
refused for what it is (kept in the refused table). Every other answer (a full tracker disk,
UNKNOWN, a deadline, a revoked certificate) keeps it, sent again with a jittered backoff."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from work_samples import record

from meshnet.core.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    MeshnetError,
    PermissionDenied,
    ResourceExhausted,
    StorageDamaged,
    StorageUnavailable,
    TrackerBusy,
    Unavailable,
)
from meshnet.core.tracking import WorkRecord
from meshnet.route.outbox import WorkOutbox, record_to_json
from meshnet.route.work_reports import ReportPolicy, WorkReporter

FAST = ReportPolicy(timeout_s=0.1, backoff_s=(0.001, 0.002), drain_s=2.0)
WITHIN_S = 5.0


@dataclass
class Tracker:
    """Answers each attempt for a request id with the next of its scripted errors, then stores it
    (once per request id, like the real store). ``always`` fails a request id for ever."""

    script: dict[str, list[MeshnetError]] = field(default_factory=dict)
    always: dict[str, MeshnetError] = field(default_factory=dict)
    stored: dict[str, WorkRecord] = field(default_factory=dict)
    attempts: list[str] = field(default_factory=list)

    async def report_work(self, sent: WorkRecord, *, timeout_s: float | None = None) -> object:
        self.attempts.append(sent.request_id)
        if sent.request_id in self.always:
            raise self.always[sent.request_id]
        errors = self.script.get(sent.request_id, [])
        if errors:
            raise errors.pop(0)
        self.stored.setdefault(sent.request_id, sent)
        return None


async def until(condition: Callable[[], bool]) -> None:
    deadline = asyncio.get_running_loop().time() + WITHIN_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "never happened"
        await asyncio.sleep(0.005)


async def test_every_answer_but_a_refusal_keeps_the_record_until_the_tracker_stores_it(tmp_path: Path) -> None:
    answers: list[MeshnetError] = [
        MeshnetError("the peer ended the call with UNKNOWN"),  # what a full disk answered before
        StorageUnavailable("tracker storage failed: database or disk is full"),
        StorageDamaged("the tracker database is damaged"),
        Unavailable("tracker unreachable"),
        DeadlineExceeded("deadline"),
        PermissionDenied("this gateway's certificate is revoked"),
        ResourceExhausted("busy"),
    ]
    tracker = Tracker(script={"r": list(answers)})
    outbox = WorkOutbox(tmp_path / "outbox.sqlite3")
    reporter = WorkReporter(tracker, FAST, outbox)
    reporter.file(record("r"))
    await until(lambda: "r" in tracker.stored)
    await reporter.drain()
    assert tracker.stored == {"r": record("r")}
    assert tracker.attempts == ["r"] * (len(answers) + 1)
    assert outbox.pending() == [] and outbox.refused_records() == []
    assert reporter.counts == {"acknowledged": 1, "retried": len(answers), "refused": 0}
    outbox.close()


async def test_a_refused_record_moves_to_the_refused_table_and_is_not_sent_again(tmp_path: Path) -> None:
    tracker = Tracker(
        always={
            "bad": InvalidArgument("tokens_out exceeds the context"),
            "dup": FailedPrecondition("work record dup was stored with other content"),
        }
    )
    outbox = WorkOutbox(tmp_path / "outbox.sqlite3")
    reporter = WorkReporter(tracker, FAST, outbox)
    for name in ("bad", "good", "dup"):
        reporter.file(record(name))
    await reporter.drain()
    assert tracker.stored == {"good": record("good")}
    assert sorted(tracker.attempts) == ["bad", "dup", "good"]  # each tried once
    assert outbox.pending() == []
    refused = {kept.request_id: (code, reason) for kept, code, reason in outbox.refused_records()}
    assert refused == {
        "bad": ("invalid_argument", "tokens_out exceeds the context"),
        "dup": ("failed_precondition", "work record dup was stored with other content"),
    }
    assert reporter.figures()["outbox_refused_records"] == 2
    outbox.close()


async def test_the_backoff_doubles_to_its_ceiling_and_each_wait_is_jittered() -> None:
    failures = 6
    for jitter, expected in ((0.0, [0.125, 0.25, 0.5, 0.5, 0.5, 0.5]), (0.999, [0.25, 0.5, 1.0, 1.0, 1.0, 1.0])):
        waits: list[float] = []

        async def sleep(seconds: float, waits: list[float] = waits) -> None:
            waits.append(seconds)
            await asyncio.sleep(0)

        tracker = Tracker(script={"r": [Unavailable("down")] * failures})
        policy = ReportPolicy(backoff_s=(0.25, 1.0))
        reporter = WorkReporter(tracker, policy, jitter=lambda jitter=jitter: jitter, sleep=sleep)
        reporter.file(record("r"))
        await until(lambda tracker=tracker: "r" in tracker.stored)  # type: ignore[misc]
        await reporter.drain()
        assert [round(wait, 3) for wait in waits] == expected


async def test_a_tracker_that_sheds_a_record_is_asked_again_after_its_hint_not_the_backoff() -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        await asyncio.sleep(0)

    tracker = Tracker(script={"r": [TrackerBusy("shedding work records", 4.0), Unavailable("down")]})
    reporter = WorkReporter(tracker, ReportPolicy(backoff_s=(0.25, 1.0)), jitter=lambda: 0.5, sleep=sleep)
    reporter.file(record("r"))
    await until(lambda: "r" in tracker.stored)
    await reporter.drain()
    # The hint (4 s, jittered at the draw's middle), not the 0.25 s backoff; then the backoff again.
    assert [round(wait, 3) for wait in waits] == [4.0, 0.375]


async def test_a_record_that_keeps_failing_does_not_hold_back_the_ones_behind_it() -> None:
    tracker = Tracker(always={"poison": MeshnetError("the tracker fails on this one")})
    reporter = WorkReporter(tracker, ReportPolicy(backoff_s=(0.001, 0.002), batch=1))
    for name in ("poison", "a", "b", "c"):
        reporter.file(record(name))
    # Acknowledged, not only stored: the tracker stores a record before the reporter hears so.
    await until(lambda: reporter.counts["acknowledged"] == 3)
    assert set(tracker.stored) == {"a", "b", "c"}
    assert reporter.figures()["outbox_records"] == 1  # poison, kept
    await reporter.drain(timeout_s=0.0)


async def test_metrics_show_the_depth_the_age_and_the_limit(tmp_path: Path) -> None:
    now = [1000.0]
    tracker = Tracker(always={name: Unavailable("down") for name in "xyz"})
    outbox = WorkOutbox(tmp_path / "outbox.sqlite3", clock=lambda: now[0])
    policy = ReportPolicy(backoff_s=(0.001, 0.002), outbox_limit=2)
    reporter = WorkReporter(tracker, policy, outbox, clock=lambda: now[0])
    for name in "xyz":
        reporter.file(record(name))
    await until(lambda: reporter.figures()["outbox_records"] == 3 and reporter.counts["retried"] >= 3)
    now[0] += 30.0
    figures = reporter.figures()
    assert (figures["outbox_oldest_seconds"], figures["outbox_limit"], figures["outbox_over_limit"]) == (30, 2, 1)
    tracker.always.clear()
    await until(lambda: reporter.figures()["outbox_records"] == 0)
    figures = reporter.figures()
    assert (figures["outbox_over_limit"], figures["outbox_oldest_seconds"]) == (0, 0)
    assert figures["work_reports_acknowledged_total"] == 3 and figures["work_reports_retried_total"] >= 3
    await reporter.drain()
    outbox.close()


async def test_a_provisional_record_is_not_sent_while_its_request_runs(tmp_path: Path) -> None:
    tracker = Tracker()
    outbox = WorkOutbox(tmp_path / "outbox.sqlite3")
    reporter = WorkReporter(tracker, FAST, outbox)
    await reporter.write_ahead(record("running", "unverified", 0))
    reporter.file(record("other"))
    await until(lambda: reporter.counts["acknowledged"] == 1)  # stored, and the outbox told
    assert "other" in tracker.stored
    await reporter.drain()
    assert "running" not in tracker.attempts
    assert outbox.pending() == [record("running", "unverified", 0)]
    outbox.close()


def test_an_outbox_of_the_earlier_version_opens_with_its_records_due(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite3"
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE outbox (request_id TEXT PRIMARY KEY, record_json TEXT NOT NULL)")
    connection.execute("INSERT INTO outbox VALUES (?, ?)", ("old", record_to_json(record("old"))))
    connection.commit()
    connection.close()
    outbox = WorkOutbox(path)
    assert outbox.due(10) == [record("old")]
    assert outbox.stats().due == 1
    outbox.close()
