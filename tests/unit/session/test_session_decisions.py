"""Pure scheduling and admission decisions (capacity: tests/unit/core/test_layer_costs.py)."""

from __future__ import annotations

from meshnet.session.admission import (
    AdmissionPolicy,
    Admit,
    PeerBounds,
    Reject,
    SlotUse,
    decide_admission,
    expired_sessions,
    out_of_budget,
)
from meshnet.session.scheduler import PendingWork, plan_tick

USUAL_PEERS = PeerBounds(share=0.5, min_token_rate=0.5, grace=60.0)
"""The worker's default peer bounds (``WorkerConfig.session_*``)."""


def _policy(
    max_sessions: int,
    *,
    max_queue: int = 64,
    evict_idle_after: float = 30.0,
    ttl: float = 600.0,
    peers: PeerBounds = USUAL_PEERS,
) -> AdmissionPolicy:
    return AdmissionPolicy(max_sessions, max_queue, evict_idle_after, ttl, peers)


def use(key: str, last_used: float, busy: bool = False, opener: str | None = None, progress: int = 1000) -> SlotUse:
    """A session opened at 0 by ``opener`` that ran ``progress`` positions (enough budget by default)."""
    return SlotUse(key, last_used, busy, opener, 0.0, progress)


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
    assert decide_admission([use("a", 0.0)], None, 0, policy, now=1.0) == Admit()
    busy_or_recent = [use("a", 0.0, True), use("b", 95.0)]
    assert isinstance(decide_admission(busy_or_recent, None, 0, policy, now=100.0), Reject)
    idle = [use("a", 10.0), use("b", 5.0), use("c", 90.0)]
    assert decide_admission(idle, None, 0, policy, now=100.0) == Admit(evict="b")


def test_admission_rejects_when_the_queue_is_full() -> None:
    decision = decide_admission([], None, 10, _policy(4, max_queue=10), now=0.0)
    assert isinstance(decision, Reject) and "queue" in decision.reason


def test_expiry_spares_busy_sessions() -> None:
    uses = [use("old", 0.0), use("busy", 0.0, True), use("new", 590.0)]
    assert expired_sessions(uses, _policy(4, ttl=600.0), now=700.0) == ["old"]


# -- bounded peers (issue 29, finding 4) ------------------------------------------------------

BOUNDED = PeerBounds(share=0.5, min_token_rate=1.0, grace=10.0)
"""A shard of 4 slots: one certificate's bound is 2 once the shard is full."""


def test_the_bound_is_a_share_of_the_slots_never_below_one() -> None:
    assert BOUNDED.bound(4) == 2
    assert BOUNDED.bound(5) == 3
    assert BOUNDED.bound(1) == 1
    assert PeerBounds(0.01, 1.0, 0.0).bound(8) == 1
    assert PeerBounds(1.0, 1.0, 0.0).bound(8) == 8


def test_a_lone_opener_fills_free_slots_past_its_share() -> None:
    policy = _policy(4, peers=BOUNDED)
    held = [use(f"g{i}", 0.0, opener="gateway") for i in range(3)]
    assert decide_admission(held, "gateway", 0, policy, now=1.0) == Admit()


def test_on_a_full_shard_an_opener_at_its_bound_is_refused_naming_it_and_evicts_nobody_else() -> None:
    policy = _policy(4, peers=BOUNDED)
    # Both of the other opener's sessions are idle and evictable for anyone under the bound.
    uses = [use("a1", 99.0, opener="attacker"), use("a2", 99.0, opener="attacker")]
    uses += [use("o1", 0.0, opener="other"), use("o2", 0.0, opener="other")]
    decision = decide_admission(uses, "attacker", 0, policy, now=100.0)
    assert isinstance(decision, Reject)
    assert "bound of 2" in decision.reason and "session share 0.5" in decision.reason
    assert decide_admission(uses, "newcomer", 0, policy, now=100.0) == Admit(evict="o1")


def test_an_opener_at_its_bound_may_evict_its_own_stale_session() -> None:
    policy = _policy(4, peers=BOUNDED)
    uses = [use("a1", 0.0, opener="a"), use("a2", 99.0, opener="a"), use("b1", 99.0, opener="b")]
    uses.append(use("b2", 99.0, opener="b"))
    assert decide_admission(uses, "a", 0, policy, now=100.0) == Admit(evict="a1")


def test_an_opener_under_its_bound_takes_a_slot_back_from_one_over_it() -> None:
    policy = _policy(4, peers=BOUNDED)
    # One certificate holds every slot, each kept busy or recent by a trickle of steps.
    uses = [use("a1", 98.0, opener="a"), use("a2", 97.0, True, opener="a")]
    uses += [use("a3", 99.0, opener="a"), use("a4", 96.5, True, opener="a")]
    assert decide_admission(uses, "head", 0, policy, now=100.0) == Admit(evict="a1")  # never a busy one
    assert isinstance(decide_admission(uses, "a", 0, policy, now=100.0), Reject)
    # Openers at (not over) their bound keep their recent sessions: the newcomer is refused.
    shared = [use("a1", 99.0, opener="a"), use("a2", 99.0, opener="a")]
    shared += [use("b1", 99.0, opener="b"), use("b2", 99.0, opener="b")]
    decision = decide_admission(shared, "head", 0, policy, now=100.0)
    assert isinstance(decision, Reject) and "hold active sessions" in decision.reason


def test_a_trickle_of_steps_runs_out_of_budget_but_progress_keeps_a_session() -> None:
    policy = _policy(2, peers=BOUNDED)
    # Opened at 0; grace 10 s plus 1 s per position at the minimum rate of 1 position/s.
    trickle = SlotUse("trickle", 99.0, False, "a", 0.0, 40)  # stepped a second ago, 40 positions in 100 s
    steady = SlotUse("steady", 99.0, False, "b", 0.0, 95)  # 95 positions in 100 s: still within budget
    assert out_of_budget(trickle, BOUNDED, now=100.0)
    assert not out_of_budget(steady, BOUNDED, now=100.0)
    assert not out_of_budget(trickle, BOUNDED, now=50.0)
    assert decide_admission([trickle, steady], "c", 0, policy, now=100.0) == Admit(evict="trickle")
    # No pressure, no eviction: a slow session on a quiet shard is not expired for its rate.
    assert expired_sessions([trickle, steady], policy, now=100.0) == []
