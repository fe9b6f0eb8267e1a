"""The tracker's checks of work records (``tracker.work_checks``): pure, with injected clocks."""

from __future__ import annotations

from dataclasses import replace

import pytest
from manual_clock import ManualClock

from meshnet.core.events import RouteHop
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeCapability
from meshnet.core.tracking import NodeWork, Route, RouteQuery, SessionTokens, WorkRecord, billing_units
from meshnet.tracker.work_checks import Tally, WorkLedger, shard_problem

CONTEXT = 512
PROMPT, GENERATED = 7, 20
HEAD, TAIL = NodeId("head"), NodeId("tail")
SESSION, REQUEST = SessionId("s-1"), RequestId("req-1")
GATEWAY = "gw-1"
STARTED = 1_000.0


def route(*names: str, epoch: int = 1) -> Route:
    capability = NodeCapability(CONTEXT, 64, CONTEXT, 1 << 20, 8, 4)
    hops = tuple(RouteHop(NodeId(n), f"{n}:1", LayerRange(2 * i, 2 * i + 2), capability) for i, n in enumerate(names))
    return Route(hops, epoch, "tiny", "Q8_0", "rcp-x", 2 * len(names), 1.0)


def record(tokens_in: int = PROMPT, tokens_out: int = GENERATED, **changes: object) -> WorkRecord:
    base = WorkRecord(
        request_id=REQUEST,
        model="tiny",
        status="completed",
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        attribution=(
            NodeWork(HEAD, LayerRange(0, 2), tokens_in + tokens_out),
            NodeWork(TAIL, LayerRange(2, 4), tokens_in + tokens_out),
        ),
        billing_units=billing_units(tokens_in, tokens_out),
        started_at=STARTED + 1,
        finished_at=STARTED + 2,
        session_id=SESSION,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def shard_counts(positions: int = PROMPT + GENERATED - 1, prompt: int = PROMPT) -> SessionTokens:
    return SessionTokens(SESSION, 1, positions, prompt)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def ledger(clock: ManualClock) -> WorkLedger:
    routed = WorkLedger(grace_s=5.0, clock=clock, wall_clock=lambda: STARTED + clock.now)
    routed.issue(RouteQuery("tiny", SESSION, request_id=REQUEST), route("head", "tail"), GATEWAY)
    return routed


def known(node: NodeId) -> bool:
    return node in (HEAD, TAIL)


def test_an_honest_record_counted_by_its_shards_stands(ledger: WorkLedger) -> None:
    for node in (HEAD, TAIL):
        assert ledger.count(node, [shard_counts()]) == (1, [])
    verdict = ledger.judge(record(), GATEWAY, known)
    assert (verdict.status, verdict.reason, verdict.judged) == ("completed", "", record())


@pytest.mark.parametrize(
    ("forged", "reason"),
    [
        (record(billing_units=1e15), "not the formula's"),
        (record(0, 10**12, billing_units=1e15), "not the formula's"),
        (record(0, 10**12, billing_units=1e12), "exceed the 512-token context"),
        (
            record(attribution=(NodeWork(NodeId("ghost"), LayerRange(0, 4), 27),)),
            "ghost were on no route issued for session s-1",
        ),
        (record(request_id=RequestId("req-other")), "routed for request req-1, not req-other"),
        (record(model="other"), "routed for model tiny"),
        (record(session_id=SessionId("s-never")), "no route was issued for session s-never"),
    ],
)
def test_an_inconsistent_record_is_disputed_with_its_reason(
    ledger: WorkLedger, forged: WorkRecord, reason: str
) -> None:
    ledger.count(TAIL, [shard_counts()])
    verdict = ledger.judge(forged, GATEWAY, known)
    assert verdict.status == "disputed" and reason in verdict.reason
    assert verdict.judged.status == "disputed" and not verdict.waiting


def test_another_gateways_record_for_a_session_is_disputed(ledger: WorkLedger) -> None:
    ledger.count(TAIL, [shard_counts()])
    # Its own ChooseRoute for the session does not make the session its own either.
    ledger.issue(RouteQuery("tiny", SESSION, request_id=REQUEST), route("head", "tail"), "gw-2")
    verdict = ledger.judge(record(), "gw-2", known)
    assert verdict.status == "disputed" and "another gateway" in verdict.reason


def test_a_record_routed_before_this_tracker_started_gets_the_static_checks_only(ledger: WorkLedger) -> None:
    earlier = record(session_id=SessionId("s-before"), started_at=STARTED - 10)
    assert ledger.judge(earlier, GATEWAY, known).status == "completed"
    stranger = replace(earlier, attribution=(NodeWork(NodeId("ghost"), LayerRange(0, 4), 27),))
    verdict = ledger.judge(stranger, GATEWAY, known)
    assert verdict.status == "disputed" and "ghost unknown to this tracker" in verdict.reason


def test_claiming_more_than_the_shards_computed_is_disputed_until_their_counts_bear_it_out(
    ledger: WorkLedger,
) -> None:
    ledger.count(TAIL, [shard_counts(positions=PROMPT + 9)])  # ten tokens sampled so far
    verdict = ledger.judge(record(), GATEWAY, known)
    assert verdict.status == "disputed" and verdict.waiting
    assert "claims 27 tokens; the route's shards computed 16 positions" in verdict.reason
    ledger.stored(verdict)
    # A late report (the session ended on the head later) counts the whole request.
    taken, borne_out = ledger.count(HEAD, [shard_counts()])
    assert (taken, borne_out) == (1, [record()])


def test_a_worker_off_the_route_cannot_count_for_it(ledger: WorkLedger) -> None:
    assert ledger.count(NodeId("stranger"), [shard_counts(positions=400)]) == (0, [])
    assert ledger.judge(record(), GATEWAY, known).status == "disputed"


def test_a_failover_route_joins_the_session(ledger: WorkLedger) -> None:
    ledger.issue(RouteQuery("tiny", SESSION), route("head", "spare", epoch=2), GATEWAY)
    failed_over = record(
        attribution=(NodeWork(HEAD, LayerRange(0, 2), 27), NodeWork(NodeId("spare"), LayerRange(2, 4), 20))
    )
    ledger.count(NodeId("spare"), [SessionTokens(SESSION, 2, PROMPT + GENERATED - 1, PROMPT + 5)])
    ledger.count(TAIL, [shard_counts(positions=PROMPT + 4)])
    assert ledger.judge(failed_over, GATEWAY, known).status == "completed"


def test_shard_tally() -> None:
    assert Tally.of([]) is None
    tally = Tally.of([SessionTokens(SESSION, 1, 26, 0), SessionTokens(SESSION, 1, 26, 7)])
    assert tally == Tally(26, 7) and tally.generated == 20
    assert shard_problem(record(tokens_in=0, tokens_out=0), None) is None
    assert shard_problem(record(), None) is not None
    assert shard_problem(record(), tally) is None
    assert shard_problem(record(tokens_in=1, tokens_out=26), tally) is not None  # shifted prompt into output


def test_a_request_whose_gateway_filed_nothing_is_filed_from_its_shards_after_the_grace(
    ledger: WorkLedger, clock: ManualClock
) -> None:
    ledger.issue(RouteQuery("tiny", SessionId("s-audit")), route("head", "tail"), GATEWAY)  # no request: a replay
    ledger.count(TAIL, [shard_counts(), SessionTokens(SessionId("s-audit"), 1, 30, 7)])
    ledger.count(HEAD, [shard_counts()])
    clock.now = 4.9
    assert ledger.due() == []
    clock.now = 5.0
    (filed,) = ledger.due()
    assert (filed.request_id, filed.status, filed.tokens_in, filed.tokens_out) == (
        REQUEST,
        "completed_by_shards",
        PROMPT,
        GENERATED,
    )
    assert filed.billing_units == billing_units(PROMPT, GENERATED)
    assert {share.node_id for share in filed.attribution} == {HEAD, TAIL}
    assert ledger.due() == []  # filed once
    assert ledger.settled_by_shards(record(status="unverified", tokens_out=0))


def test_a_successors_unverified_record_is_completed_from_the_shards(ledger: WorkLedger) -> None:
    written_ahead = record(tokens_out=0, status="unverified")
    assert ledger.judge(written_ahead, GATEWAY, known).waiting  # nothing counted yet: wait for it
    ledger.count(TAIL, [shard_counts()])
    verdict = ledger.judge(written_ahead, GATEWAY, known)
    assert verdict.status == "completed_by_shards"
    assert (verdict.judged.tokens_in, verdict.judged.tokens_out) == (PROMPT, GENERATED)


def test_the_ledger_is_bounded(clock: ManualClock) -> None:
    ledger = WorkLedger(grace_s=5.0, clock=clock, limit=2)
    for index in range(3):
        ledger.issue(RouteQuery("tiny", SessionId(f"s-{index}"), request_id=REQUEST), route("head"), GATEWAY)
    assert ledger.count(HEAD, [SessionTokens(SessionId("s-0"), 1, 3, 2)]) == (0, [])
    assert ledger.count(HEAD, [SessionTokens(SessionId("s-2"), 1, 3, 2)]) == (1, [])


def test_a_forgotten_sessions_record_gets_the_static_checks_only(clock: ManualClock) -> None:
    ledger = WorkLedger(grace_s=5.0, clock=clock, wall_clock=lambda: STARTED + clock.now, limit=1)
    ledger.issue(RouteQuery("tiny", SESSION, request_id=REQUEST), route("head", "tail"), GATEWAY)
    clock.now = 10.0
    ledger.issue(RouteQuery("tiny", SessionId("s-later")), route("head", "tail"), GATEWAY)  # forgets s-1
    assert ledger.remembered_since == STARTED + 10
    assert ledger.judge(record(), GATEWAY, known).status == "completed"  # started (STARTED + 1) before
    assert ledger.judge(record(started_at=STARTED + 20, finished_at=STARTED + 21), GATEWAY, known).status == "disputed"
