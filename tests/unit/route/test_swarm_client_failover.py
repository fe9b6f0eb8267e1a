"""SwarmClient decisions with doubles: which failures fail over, what stays excluded, what is billed.

The end-to-end tests (tests/integration/test_swarm_failover.py) kill real workers, where the
interesting cases depend on timing; here each is forced: a dead hop that the tracker still lists,
an untyped error relayed by a shard whose neighbour died, a tracker down for longer than one
report attempt, a prompt that does not fit the shards' context.

The tracker and the route driver are doubles (``FakeTracker``, ``FakeDriver``): they cannot show
gRPC statuses, deadlines or when a real failure is noticed; those are the end-to-end tests'.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from meshnet.core.errors import (
    ContextLengthExceeded,
    InvalidArgument,
    MeshnetError,
    NoRoute,
    StepTimedOut,
    Unavailable,
)
from meshnet.core.events import RouteAccepted, RouteHealth, RouteHop, TokenGenerated
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import NodeId, RequestId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeCapability
from meshnet.core.tracking import Route, RouteTiming, WorkRecord, billing_units
from meshnet.route import swarm as swarm_module
from meshnet.route.audit import AuditCase
from meshnet.route.life import Failure, LifeItem, NoText, Outcome, TextPiece, TokenText
from meshnet.route.outbox import WorkOutbox
from meshnet.route.swarm import SwarmClient, SwarmConfig
from meshnet.route.work_reports import ReportPolicy, WorkReporter

REQUEST = GenerationRequest((1, 2, 3), max_tokens=6, model="tiny")


def hop(name: str, start: int, stop: int, context: int) -> RouteHop:
    capability = NodeCapability(context, 64, context, 1 << 20, 8, 4)
    return RouteHop(NodeId(name), f"{name}:1", LayerRange(start, stop), capability)


def route_via(middle: str, epoch: int, context: int = 512) -> Route:
    hops = (hop("head", 0, 2, context), hop(middle, 2, 4, context), hop("tail", 4, 6, context))
    return Route(hops, epoch, "tiny", "Q8_0", "rcp-x", 6, 1.0)


@dataclass
class FakeTracker:
    """Plans over the listed middles in order, skipping excluded ones; like the tracker, it still
    lists a dead node until heartbeats expire it. Fails ``report_failures`` reports first."""

    listed: Sequence[str] = ("a", "b", "c")
    report_failures: int = 0
    context: int = 512
    """Positions a session holds on every hop of the routes planned (each hop's capability)."""
    excludes: list[frozenset[NodeId]] = field(default_factory=list)
    reports: list[WorkRecord] = field(default_factory=list)
    timings: list[RouteTiming] = field(default_factory=list)
    attempts: int = 0

    async def choose_route(self, model: str, *, session_id: Any = None, exclude: Any = (), **_: object) -> Route:
        self.excludes.append(frozenset(exclude))
        for epoch, name in enumerate(self.listed, start=1):
            if NodeId(name) not in self.excludes[-1]:
                return route_via(name, epoch + len(self.excludes), self.context)
        raise NoRoute("layers 2:4 have no live shard")

    async def report_work(self, record: WorkRecord, *, timeout_s: float | None = None) -> None:
        self.attempts += 1
        if self.attempts <= self.report_failures:
            raise Unavailable("tracker unreachable")
        self.reports.append(record)

    async def report_route_timing(self, timing: RouteTiming, *, timeout_s: float | None = None) -> bool:
        self.timings.append(timing)
        return True


class FakeDriver:
    """Generates token = position; a route through a middle in ``failing`` raises its error
    after ``fail_after`` tokens."""

    def __init__(self, failing: Mapping[NodeId, MeshnetError], fail_after: int = 2) -> None:
        self.failing = failing
        self.fail_after = fail_after
        self.histories: list[tuple[int, ...]] = []
        self.resumes: list[tuple[int, ...]] = []
        """The histories a failover asked the new route's snapshots for."""
        self.snapshots: list[Any] = []

    async def plan(self, session: Any, request: GenerationRequest) -> None:
        return None  # these routes hold no prompt KV

    async def resume(self, session: Any, request: GenerationRequest, history: Sequence[int]) -> Any:
        self.resumes.append(tuple(history))
        return ("snapshot", len(history))  # what run must be handed to restore

    async def run(
        self,
        session: Any,
        request: GenerationRequest,
        *,
        history: Sequence[int] = (),
        kv: Any = "probe",
        snapshot: Any = None,
    ) -> AsyncIterator[Any]:
        self.histories.append(tuple(history))
        self.snapshots.append(snapshot)
        middle = session.hops[1].node_id
        for index in range(len(history), request.max_tokens):
            if middle in self.failing and index >= self.fail_after:
                raise self.failing[middle]
            yield TokenGenerated(100 + index, index, 1.0)


def client(tracker: FakeTracker, driver: FakeDriver, monkeypatch: pytest.MonkeyPatch, dead: set[str]) -> SwarmClient:
    async def serving(pool: object, address: str, timeout_s: float = 0.0, node_id: str | None = None) -> bool:
        return address.split(":")[0] not in dead  # the health check of a dead hop fails

    monkeypatch.setattr(swarm_module, "is_serving", serving)
    config = SwarmConfig(reports=ReportPolicy(backoff_s=(0.001, 0.001)))
    return SwarmClient(tracker, object(), driver, config)  # type: ignore[arg-type]


class Items(list[LifeItem]):
    """A ``LifeSink`` that keeps every item."""

    def put(self, item: LifeItem) -> None:
        self.append(item)


async def collect(swarm: SwarmClient) -> list[Any]:
    items = Items()
    await swarm.serve(REQUEST, RequestId("req-1"), NoText(), items)
    await swarm.drain_reports(timeout_s=5)
    return items


def tokens(items: list[Any]) -> int:
    """How many tokens the client was shown (the last is the one that ended the budget)."""
    return max((item.generated for item in items if isinstance(item, TokenText)), default=0)


def failure(items: list[Any]) -> Exception:
    assert isinstance(items[-1], Failure), items[-1]
    return items[-1].error


async def test_a_hop_found_dead_stays_excluded_across_failovers(monkeypatch: pytest.MonkeyPatch) -> None:
    # a dies mid-request; the tracker still lists it, so b is planned; b dies too; c must not be
    # passed over for a again.
    tracker = FakeTracker()
    driver = FakeDriver({NodeId("a"): Unavailable("a lost"), NodeId("b"): Unavailable("b lost")})
    events = await collect(client(tracker, driver, monkeypatch, dead={"a", "b"}))
    assert tracker.excludes == [frozenset(), {NodeId("a")}, {NodeId("a"), NodeId("b")}]
    assert [e.hops[1].node_id for e in events if isinstance(e, RouteAccepted)] == ["a", "b", "c"]
    assert tokens(events) == 6
    assert driver.histories == [(), (100, 101), (100, 101)]
    # Each failover asks the new route for a snapshot to resume from and hands it to the driver;
    # the first route has none to ask for.
    assert driver.resumes == [(100, 101), (100, 101)]
    assert driver.snapshots == [None, ("snapshot", 2), ("snapshot", 2)]
    assert events[-1] == Outcome("length", events[-1].usage) and events[-1].usage.completion_tokens == 6
    assert tracker.reports[0].status == "completed"


async def test_a_request_served_by_one_route_reports_the_routes_decode_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracker = FakeTracker()
    await collect(client(tracker, FakeDriver({}), monkeypatch, dead=set()))
    (timing,) = tracker.timings
    assert timing.hops == (NodeId("head"), NodeId("a"), NodeId("tail"))
    assert timing.tokens == 6 and timing.decode_ms_per_token >= 0  # 5 gaps after the first token


async def test_a_request_that_failed_over_reports_no_route_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    # It ran on two routes: its time per token is neither's.
    tracker = FakeTracker()
    await collect(client(tracker, FakeDriver({NodeId("a"): Unavailable("a lost")}), monkeypatch, dead={"a"}))
    assert tracker.reports[0].status == "completed" and tracker.timings == []


async def test_untyped_error_with_a_dead_hop_fails_over(monkeypatch: pytest.MonkeyPatch) -> None:
    # The head relays its neighbour's death as gRPC INTERNAL ("internal"), not UNAVAILABLE.
    tracker = FakeTracker()
    driver = FakeDriver({NodeId("a"): MeshnetError("Internal error from Core")})
    events = await collect(client(tracker, driver, monkeypatch, dead={"a"}))
    assert [type(e).__name__ for e in events if isinstance(e, RouteHealth | RouteAccepted)] == [
        "RouteAccepted",
        "RouteHealth",
        "RouteAccepted",
    ]
    assert tokens(events) == 6


async def test_untyped_error_with_every_hop_alive_fails_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    tracker = FakeTracker()
    swarm = client(tracker, FakeDriver({NodeId("a"): MeshnetError("a bug, not a loss")}), monkeypatch, dead=set())
    assert "a bug" in str(failure(await collect(swarm)))
    assert tracker.excludes == [frozenset()]
    assert tracker.reports[0].status == "failed" and tracker.reports[0].tokens_out == 2


async def test_a_step_timeout_with_every_hop_alive_avoids_the_whole_route(monkeypatch: pytest.MonkeyPatch) -> None:
    # A hop hung in its engine still answers its health check: the route as a whole is avoided,
    # else the tracker would hand the session the same shards (and the hung hop) again.
    tracker = FakeTracker()
    driver = FakeDriver({NodeId("a"): StepTimedOut("no answer to step 3 within 5.9 s")})
    events = await collect(client(tracker, driver, monkeypatch, dead=set()))
    assert tracker.excludes == [frozenset(), {NodeId("head"), NodeId("a"), NodeId("tail")}]
    assert [e.hops[1].node_id for e in events if isinstance(e, RouteAccepted)] == ["a", "b"]
    assert tokens(events) == 6 and driver.histories == [(), (100, 101)]


async def test_a_step_timeout_with_a_dead_hop_avoids_only_that_hop(monkeypatch: pytest.MonkeyPatch) -> None:
    tracker = FakeTracker()
    driver = FakeDriver({NodeId("a"): StepTimedOut("no answer to step 3 within 5.9 s")})
    events = await collect(client(tracker, driver, monkeypatch, dead={"a"}))
    assert tracker.excludes == [frozenset(), {NodeId("a")}]
    assert tokens(events) == 6


async def test_client_errors_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    tracker = FakeTracker()
    driver = FakeDriver({NodeId("a"): InvalidArgument("bad frame")})
    assert isinstance(failure(await collect(client(tracker, driver, monkeypatch, dead={"a"}))), InvalidArgument)
    assert len(tracker.excludes) == 1


async def test_failovers_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    tracker = FakeTracker()
    lost = {NodeId(name): Unavailable(f"{name} lost") for name in "abc"}
    error = failure(await collect(client(tracker, FakeDriver(lost), monkeypatch, dead={"a", "b", "c"})))
    assert isinstance(error, Unavailable) and "c lost" in error.message
    assert len(tracker.excludes) == 1 + SwarmConfig().max_failovers


async def test_work_record_is_retried_until_the_tracker_takes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    tracker = FakeTracker(report_failures=5)
    await collect(client(tracker, FakeDriver({}), monkeypatch, dead=set()))
    assert tracker.attempts == 6
    assert [(r.request_id, r.status, r.tokens_out) for r in tracker.reports] == [("req-1", "completed", 6)]


async def test_prompt_beyond_the_shards_context_is_refused_before_any_event(monkeypatch: pytest.MonkeyPatch) -> None:
    tracker = FakeTracker(context=8)
    swarm = client(tracker, FakeDriver({}), monkeypatch, dead=set())
    items = await collect(swarm)  # 3 prompt + 6 new > 8 positions
    assert len(items) == 1
    error = failure(items)
    assert isinstance(error, ContextLengthExceeded) and "at most 5" in error.message
    await asyncio.sleep(0)
    assert tracker.reports == []


async def test_the_record_is_written_ahead_and_its_outcome_replaces_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    tracker = FakeTracker()
    swarm = client(tracker, FakeDriver({}), monkeypatch, dead=set())
    outbox = WorkOutbox(tmp_path / "outbox.sqlite3")
    swarm.reports = WorkReporter(tracker, swarm._config.reports, outbox)
    ahead: list[WorkRecord] = []

    class Watch(Items):
        def put(self, item: LifeItem) -> None:
            if isinstance(item, RouteAccepted):  # mid-request, a crash would leave this
                ahead.extend(outbox.pending())
            super().put(item)

    items = Watch()
    await swarm.serve(REQUEST, RequestId("req-1"), NoText(), items)
    await swarm.drain_reports(timeout_s=5)
    assert [(r.request_id, r.status, r.tokens_out) for r in ahead] == [("req-1", "unverified", 0)]
    assert isinstance(items[-1], Outcome)
    assert [(r.status, r.tokens_out) for r in tracker.reports] == [("completed", 6)]
    assert outbox.pending() == []
    outbox.close()


class StopAt:
    """A text plug whose stop string is completed by token ``stop`` (each token is one word)."""

    def __init__(self, stop: int) -> None:
        self.stop = stop

    def push(self, token_id: int) -> TextPiece:
        return TextPiece("" if token_id == self.stop else f"w{token_id} ", token_id == self.stop)

    def flush(self) -> str:
        return ""


@dataclass
class Audits:
    cases: list[AuditCase] = field(default_factory=list)

    def submit(self, case: AuditCase) -> bool:
        self.cases.append(case)
        return True


async def test_a_stop_string_completes_is_billed_as_shown_and_is_offered_to_the_audit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracker, driver = FakeTracker(), FakeDriver({})
    swarm = client(tracker, driver, monkeypatch, dead=set())
    swarm.auditor = audits = Audits()  # type: ignore[assignment]
    items = Items()
    await swarm.serve(REQUEST, RequestId("req-1"), StopAt(102), items)
    await swarm.drain_reports(timeout_s=5)
    outcome = items[-1]
    assert isinstance(outcome, Outcome) and outcome.finish_reason == "stop"
    assert "".join(item.text for item in items if isinstance(item, TokenText)) == "w100 w101 "
    [record] = tracker.reports
    assert (record.status, record.tokens_in, record.tokens_out) == ("completed", 3, 3)
    assert record.billing_units == outcome.usage.billing_units == billing_units(3, 3)
    assert (outcome.usage.prompt_tokens, outcome.usage.completion_tokens) == (3, 3)
    assert [case.generated for case in audits.cases] == [(100, 101, 102)]
