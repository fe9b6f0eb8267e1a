"""Pure scheduling and admission decisions (capacity: tests/unit/core/test_layer_costs.py)."""

from __future__ import annotations

from meshnet.session.admission import (
    AdmissionPolicy,
    Admit,
    Reject,
    SlotUse,
    decide_admission,
    expired_sessions,
)
from meshnet.session.scheduler import PendingWork, plan_tick


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
