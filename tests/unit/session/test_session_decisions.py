"""Pure scheduling, admission and capacity decisions, and the session table's frame checks."""

from __future__ import annotations

import pytest

from meshnet.core.errors import CacheMiss, FailedPrecondition, ResourceExhausted, RouteStale
from meshnet.core.ids import RequestId, SessionId
from meshnet.session.admission import (
    AdmissionPolicy,
    Admit,
    Reject,
    SlotUse,
    decide_admission,
    expired_sessions,
    kv_bytes_per_session,
    plan_capacity,
)
from meshnet.session.scheduler import PendingWork, plan_tick
from meshnet.session.table import SessionTable


def _policy(
    max_sessions: int, *, max_queue: int = 64, evict_idle_after: float = 30.0, ttl: float = 600.0
) -> AdmissionPolicy:
    return AdmissionPolicy(max_sessions, max_queue, evict_idle_after, ttl)


def work(ticket: int, n: int, at: float = 0.0, deadline: float | None = None) -> PendingWork:
    return PendingWork(ticket, n, at, deadline)


def test_tick_runs_every_decode_step_and_one_prefill_chunk_oldest_first() -> None:
    pending = [work(1, 64, 0.0), work(2, 1, 1.0), work(3, 32, 0.5), work(4, 1, 2.0), work(5, 1, 0.1)]
    plan = plan_tick(pending, now=3.0, max_decode_batch=8)
    assert plan.run == (5, 2, 4, 1)
    assert plan.expired == ()


def test_tick_caps_the_decode_batch_and_fails_expired_work_before_it_runs() -> None:
    pending = [work(i, 1, float(i)) for i in range(10)] + [work(99, 1, 0.0, deadline=1.0)]
    plan = plan_tick(pending, now=5.0, max_decode_batch=4)
    assert plan.expired == (99,)
    assert plan.run == (0, 1, 2, 3)


def test_prefill_never_starves_a_waiting_chunk_runs_in_every_tick() -> None:
    decode = [work(i, 1, float(i)) for i in range(50)]
    plan = plan_tick([*decode, work(100, 256, 99.0)], now=100.0, max_decode_batch=64)
    assert plan.run[-1] == 100


def test_admission_admits_until_full_then_evicts_only_long_idle_sessions() -> None:
    policy = _policy(2, max_queue=10)
    assert decide_admission([SlotUse("a", 0.0, False)], 0, policy, now=1.0) == Admit()
    busy_or_recent = [SlotUse("a", 0.0, True), SlotUse("b", 95.0, False)]
    assert isinstance(decide_admission(busy_or_recent, 0, policy, now=100.0), Reject)
    idle = [SlotUse("a", 10.0, False), SlotUse("b", 5.0, False), SlotUse("c", 90.0, False)]
    assert decide_admission(idle, 0, policy, now=100.0) == Admit(evict="b")


def test_admission_rejects_when_the_queue_is_full() -> None:
    decision = decide_admission([], 10, _policy(4, max_queue=10), now=0.0)
    assert isinstance(decision, Reject) and "queue" in decision.reason


def test_expiry_spares_busy_sessions() -> None:
    uses = [SlotUse("old", 0.0, False), SlotUse("busy", 0.0, True), SlotUse("new", 590.0, False)]
    assert expired_sessions(uses, _policy(4, ttl=600.0), now=700.0) == ["old"]


def test_capacity_follows_the_memory_budget() -> None:
    kv = kv_bytes_per_session(n_ctx=2048, n_layers=10, n_embd=576, n_head=9, n_head_kv=3)
    assert kv == 2 * 2048 * 10 * 192 * 2
    plan = plan_capacity(
        requested_sessions=8, weight_bytes=100, kv_per_session=kv, scratch_bytes=50, budget_bytes=150 + 3 * kv + 1
    )
    assert plan.max_sessions == 3
    assert (
        plan_capacity(
            requested_sessions=8, weight_bytes=1, kv_per_session=kv, scratch_bytes=1, budget_bytes=None
        ).max_sessions
        == 8
    )
    with pytest.raises(ResourceExhausted, match="one session"):
        plan_capacity(requested_sessions=8, weight_bytes=100, kv_per_session=kv, scratch_bytes=50, budget_bytes=200)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_table_checks_steps_positions_and_epochs() -> None:
    clock = Clock()
    table = SessionTable(_policy(2), clock=clock)
    session, evicted = table.open(SessionId("s1"), RequestId("r1"), epoch=3, queue_depth=0)
    assert evicted is None
    assert table.check_step(session, step=0, position=0, epoch=3) == "next"
    table.record(session, step=0, next_position=10, result="first")
    assert table.check_step(session, step=0, position=0, epoch=3) == "duplicate"
    with pytest.raises(FailedPrecondition, match="position"):
        table.check_step(session, step=1, position=11, epoch=3)
    with pytest.raises(FailedPrecondition, match="out of order"):
        table.check_step(session, step=5, position=10, epoch=3)
    with pytest.raises(RouteStale):
        table.check_step(session, step=1, position=10, epoch=2)
    with pytest.raises(FailedPrecondition, match="already exists"):
        table.open(SessionId("s1"), RequestId("r1"), epoch=3, queue_depth=0)


def test_table_reuses_slots_and_answers_cache_miss_for_evicted_sessions() -> None:
    clock = Clock()
    table = SessionTable(_policy(1, evict_idle_after=5.0), clock=clock)
    first, _ = table.open(SessionId("a"), RequestId("r"), epoch=0, queue_depth=0)
    with pytest.raises(ResourceExhausted):
        table.open(SessionId("b"), RequestId("r"), epoch=0, queue_depth=0)
    clock.now = 10.0
    second, evicted = table.open(SessionId("b"), RequestId("r"), epoch=0, queue_depth=0)
    assert evicted is first and second.slot == first.slot
    with pytest.raises(CacheMiss, match="evicted"):
        table.get(SessionId("a"))
    assert table.evictions == 1 and table.rejections == 1


def test_table_refuses_new_sessions_from_an_older_route_epoch() -> None:
    table = SessionTable(_policy(2))
    table.min_epoch = 5
    with pytest.raises(RouteStale):
        table.open(SessionId("s"), RequestId("r"), epoch=4, queue_depth=0)
