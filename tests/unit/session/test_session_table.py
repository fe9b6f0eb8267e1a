"""The session table: frame checks, idempotency, slots, eviction, expiry and typed session state."""

from __future__ import annotations

import pytest
from manual_clock import ManualClock

from meshnet.core.errors import CacheMiss, FailedPrecondition, ResourceExhausted, RouteStale
from meshnet.core.ids import SessionId
from meshnet.session.admission import AdmissionPolicy, PeerBounds
from meshnet.session.table import Session, SessionTable
from meshnet.wire.frames import StepResult

USUAL_PEERS = PeerBounds(share=0.5, min_token_rate=0.5, grace=60.0)
"""The worker's default peer bounds (``WorkerConfig.session_*``)."""


def admission_policy(
    max_sessions: int,
    *,
    max_queue: int = 64,
    evict_idle_after: float = 30.0,
    ttl: float = 600.0,
    peers: PeerBounds = USUAL_PEERS,
) -> AdmissionPolicy:
    """An admission policy with the worker's usual limits unless a test says otherwise."""
    return AdmissionPolicy(max_sessions, max_queue, evict_idle_after, ttl, peers)


def result(session: str, step: int, next_position: int, token: int | None = None) -> StepResult:
    return StepResult(SessionId(session), step, next_position, token)


def open_session(
    table: SessionTable[str], key: str, state: str = "state", epoch: int = 0
) -> tuple[Session[str], Session[str] | None]:
    return table.open(SessionId(key), epoch, 0, lambda: state)


def test_table_checks_steps_positions_and_epochs() -> None:
    table = SessionTable[str](admission_policy(2), clock=ManualClock())
    session, evicted = open_session(table, "s1", epoch=3)
    assert evicted is None
    assert table.check_step(session, step=0, position=0, epoch=3) is None
    first = result("s1", 0, 10, token=7)
    table.record(session, step=0, next_position=10, result=first)
    assert session.next_position == 10
    assert table.check_step(session, step=0, position=0, epoch=3) is first  # a repeat: the same answer
    assert table.check_step(session, step=1, position=10, epoch=3) is None
    with pytest.raises(FailedPrecondition, match="position 11 does not continue"):
        table.check_step(session, step=1, position=11, epoch=3)
    with pytest.raises(FailedPrecondition, match="step 5 out of order: expected 1"):
        table.check_step(session, step=5, position=10, epoch=3)
    with pytest.raises(RouteStale):
        table.check_step(session, step=1, position=10, epoch=2)
    with pytest.raises(FailedPrecondition, match="already exists"):
        open_session(table, "s1", epoch=3)


def test_the_first_step_must_be_zero_at_position_zero() -> None:
    table = SessionTable[str](admission_policy(1, max_queue=64, evict_idle_after=30.0, ttl=600.0))
    session, _ = open_session(table, "s")
    with pytest.raises(FailedPrecondition, match="expected 0"):
        table.check_step(session, step=1, position=0, epoch=0)
    with pytest.raises(FailedPrecondition, match="position 3"):
        table.check_step(session, step=0, position=3, epoch=0)


def test_table_reuses_slots_and_answers_cache_miss_for_evicted_sessions() -> None:
    clock = ManualClock()
    table = SessionTable[str](admission_policy(1, evict_idle_after=5.0), clock=clock)
    first, _ = open_session(table, "a", state="kept by a")
    with pytest.raises(ResourceExhausted):
        open_session(table, "b")
    clock.now = 10.0
    second, evicted = open_session(table, "b", state="kept by b")
    assert evicted is first and evicted.state == "kept by a"  # the owner can release what a kept
    assert second.slot == first.slot and second.state == "kept by b"
    with pytest.raises(CacheMiss, match="evicted"):
        table.get(SessionId("a"))
    assert table.evictions == 1 and table.rejections == 1


def test_a_busy_session_is_never_evicted() -> None:
    clock = ManualClock()
    table = SessionTable[str](admission_policy(1, evict_idle_after=5.0), clock=clock)
    first, _ = open_session(table, "a")
    first.busy = True
    clock.now = 100.0
    with pytest.raises(ResourceExhausted, match="KV slots are taken"):
        open_session(table, "b")
    assert table.get(SessionId("a")) is first


def test_state_is_made_only_for_an_admitted_session_and_a_failure_changes_nothing() -> None:
    clock = ManualClock()
    table = SessionTable[str](admission_policy(1, evict_idle_after=5.0), clock=clock)
    made: list[str] = []

    def make() -> str:
        made.append("x")
        return "x"

    open_session(table, "a")
    with pytest.raises(ResourceExhausted):
        table.open(SessionId("b"), 0, 0, make)
    assert made == []  # refused before any state (a downstream connection) was made

    def fail() -> str:
        raise ConnectionError("no route to the next hop")

    clock.now = 10.0  # "a" may now be evicted, but a failing state must not evict it
    with pytest.raises(ConnectionError):
        table.open(SessionId("b"), 0, 0, fail)
    assert SessionId("a") in table and SessionId("b") not in table
    assert table.evictions == 0 and table.free_slots == 0


def test_lowest_free_slot_first_and_closed_sessions_leave_a_reason() -> None:
    table = SessionTable[str](admission_policy(3))
    slots = [open_session(table, key)[0].slot for key in ("a", "b", "c")]
    assert slots == [0, 1, 2]
    assert table.close(SessionId("b"), reason="stream ended") is not None
    assert table.close(SessionId("b")) is None
    assert open_session(table, "d")[0].slot == 1
    with pytest.raises(CacheMiss, match="stream ended"):
        table.get(SessionId("b"))
    with pytest.raises(CacheMiss, match="unknown"):
        table.get(SessionId("never"))


def test_table_refuses_new_sessions_from_an_older_route_epoch() -> None:
    table = SessionTable[str](admission_policy(2))
    table.min_epoch = 5
    with pytest.raises(RouteStale):
        open_session(table, "s", epoch=4)
    assert open_session(table, "s", epoch=5)[0].epoch == 5


def test_expiry_names_idle_sessions_past_their_ttl_but_not_busy_ones() -> None:
    clock = ManualClock()
    table = SessionTable[str](admission_policy(3, ttl=60.0), clock=clock)
    idle, _ = open_session(table, "idle")
    busy, _ = open_session(table, "busy")
    busy.busy = True
    clock.now = 50.0
    open_session(table, "recent")
    clock.now = 61.0
    assert table.expired() == [SessionId("idle")]
    table.record(idle, step=0, next_position=1, result=result("idle", 0, 1))  # a step renews it
    assert table.expired() == []


def test_one_certificate_is_bounded_and_its_trickle_cannot_hold_a_slot_for_ever() -> None:
    """Finding 4 of issue 29: a worker certificate filled a shard and kept every slot with one
    step every 10 s. Here it may fill the free slots, gives one back to a newcomer under its
    share, is refused at its bound, and its trickled session is evicted once out of budget."""
    clock = ManualClock()
    peers = PeerBounds(share=0.5, min_token_rate=1.0, grace=10.0)
    table = SessionTable[str](admission_policy(2, evict_idle_after=30.0, peers=peers), clock=clock)
    first, _ = table.open(SessionId("a1"), 0, 0, lambda: "a", opener="attacker")
    second, _ = table.open(SessionId("a2"), 0, 0, lambda: "a", opener="attacker")  # past its share: a slot was free
    assert first.opener == "attacker" and table.free_slots == 0
    clock.now = 1.0
    table.record(first, step=0, next_position=1, result=result("a1", 0, 1))
    table.record(second, step=0, next_position=1, result=result("a2", 0, 1))
    _, evicted = table.open(SessionId("u1"), 0, 0, lambda: "user", opener="head")
    assert evicted is first  # the attacker was over its bound of 1: its least recently used goes
    with pytest.raises(ResourceExhausted, match="at or over its bound of 1"):
        table.open(SessionId("a3"), 0, 0, lambda: "a", opener="attacker")
    table.close(SessionId("u1"))
    user, _ = table.open(SessionId("u1"), 0, 0, lambda: "user", opener="head")
    # The user's session decodes on (10 positions/s); the attacker's sends one position every 5 s:
    # never idle for the 30 s eviction, but slower than 1 position/s.
    refused_at = []
    for step in range(1, 10):
        clock.now = 1.0 + 5.0 * step
        table.record(second, step=step, next_position=1 + step, result=result("a2", step, 1 + step))
        table.record(user, step=step, next_position=50 * step, result=result("u1", step, 50 * step))
        try:
            _, evicted = table.open(SessionId(f"v{step}"), 0, 0, lambda: "user", opener="other")
        except ResourceExhausted:
            refused_at.append(clock.now)
            continue
        break
    assert evicted is second
    # Out of budget once now - 0 > 10 + positions / 1: at 16 s it holds 4 positions (14 s of budget).
    assert refused_at == [6.0, 11.0] and clock.now == 16.0
