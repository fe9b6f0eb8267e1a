"""The membership exchange's pure decisions, without etcd: which ``nodes/<id>`` keys are withdrawn
(``tracker.etcd.membership_rules``) and which heartbeats of other replicas' digests are counted
(``tracker.etcd.membership_apply.heard_loads``). Each expectation is written out by hand; the
same rules against a real etcd are test_tracker_etcd_membership.py's."""

from __future__ import annotations

from meshnet.core.ids import NodeId
from meshnet.core.tracking import NodeLoad
from meshnet.tracker.etcd.membership_apply import heard_loads
from meshnet.tracker.etcd.membership_rules import plan_withdrawals
from meshnet.tracker.etcd.membership_values import Outbound, Snapshot

A, B, C = NodeId("node-a"), NodeId("node-b"), NodeId("node-c")
STALE_AFTER_S = 12.0


def outbound(
    *,
    known: frozenset[NodeId] = frozenset(),
    departed: dict[NodeId, int] | None = None,
    quarantined: frozenset[NodeId] = frozenset(),
    now: float = 100.0,
) -> Outbound:
    return Outbound([], {}, known, {}, {}, None, departed or {}, quarantined, now)


def test_a_departed_node_nobody_hears_is_withdrawn_at_once() -> None:
    plan = plan_withdrawals(outbound(departed={A: 7}), {A: 7}, set(), {}, STALE_AFTER_S)
    assert plan.deletes == ((A, 7),)
    assert plan.settled == {A}


def test_a_departed_node_another_replica_hears_keeps_its_key() -> None:
    plan = plan_withdrawals(outbound(departed={A: 7}), {A: 7}, {A}, {}, STALE_AFTER_S)
    assert plan.deletes == ()
    assert plan.settled == frozenset()


def test_a_departed_node_registered_again_elsewhere_or_gone_is_settled_without_a_delete() -> None:
    plan = plan_withdrawals(outbound(departed={A: 7, B: 3}), {A: 9}, set(), {}, STALE_AFTER_S)
    assert plan.deletes == ()
    assert plan.settled == {A, B}


def test_a_quarantined_node_keeps_its_key() -> None:
    quarantined = frozenset({A, B})
    plan = plan_withdrawals(
        outbound(departed={A: 7}, quarantined=quarantined, now=1000.0), {A: 7, B: 5}, set(), {B: (0.0, 5)}, 1.0
    )
    assert plan.deletes == ()
    assert plan.settled == frozenset()
    assert plan.unheard == {}


def test_a_key_nobody_hears_is_withdrawn_only_after_the_stale_window() -> None:
    first = plan_withdrawals(outbound(now=100.0), {C: 4}, set(), {}, STALE_AFTER_S)
    assert (first.deletes, first.unheard) == ((), {C: (100.0, 4)})
    at_the_edge = plan_withdrawals(outbound(now=112.0), {C: 4}, set(), first.unheard, STALE_AFTER_S)
    assert (at_the_edge.deletes, at_the_edge.unheard) == ((), {C: (100.0, 4)})
    past = plan_withdrawals(outbound(now=112.5), {C: 4}, set(), at_the_edge.unheard, STALE_AFTER_S)
    assert (past.deletes, past.unheard) == (((C, 4),), {})
    assert past.settled == frozenset()  # settled names departed nodes only


def test_a_key_rewritten_meanwhile_starts_its_wait_again() -> None:
    plan = plan_withdrawals(outbound(now=200.0), {C: 8}, set(), {C: (100.0, 4)}, STALE_AFTER_S)
    assert (plan.deletes, plan.unheard) == ((), {C: (200.0, 8)})


def test_a_key_heard_or_held_here_is_forgotten_and_so_is_one_gone() -> None:
    unheard = {A: (0.0, 1), B: (0.0, 2), C: (0.0, 3)}
    plan = plan_withdrawals(outbound(known=frozenset({B}), now=500.0), {A: 1, B: 2}, {A}, unheard, STALE_AFTER_S)
    assert (plan.deletes, plan.unheard) == ((), {})


def test_departed_deletes_come_before_stale_ones() -> None:
    plan = plan_withdrawals(outbound(departed={A: 7}, now=500.0), {C: 3, A: 7}, set(), {C: (0.0, 3)}, STALE_AFTER_S)
    assert plan.deletes == ((A, 7), (C, 3))
    assert plan.unheard == {A: (500.0, 7)}  # its delete is conditional: a key rewritten since stays


def snapshot(heard: dict[str, dict[NodeId, NodeLoad]], revisions: dict[str, int]) -> Snapshot:
    return Snapshot({}, heard, frozenset(), 0, revisions=revisions)


def test_a_digest_rewritten_counts_its_loads_and_one_read_again_only_keeps_its_nodes_alive() -> None:
    busy, idle = NodeLoad(free_sessions=1), NodeLoad(free_sessions=9)
    first = snapshot({"r1": {A: busy}, "r2": {B: idle}}, {"r1": 10, "r2": 20})
    assert heard_loads(None, first) == {A: busy, B: idle}
    again = snapshot({"r1": {A: idle}, "r2": {B: busy}}, {"r1": 11, "r2": 20})
    assert heard_loads(first, again) == {A: idle, B: None}


def test_a_vanished_replicas_nodes_are_heard_once_more_without_a_load() -> None:
    load = NodeLoad(free_sessions=3)
    before = snapshot({"r1": {A: load}, "r2": {B: load, C: load}}, {"r1": 10, "r2": 20})
    after = snapshot({"r1": {A: load, C: load}}, {"r1": 11})
    # r2 died: B alive once more (no load), C's new load from r1's rewritten digest wins.
    assert heard_loads(before, after) == {B: None, C: load, A: load}
