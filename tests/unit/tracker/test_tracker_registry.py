"""The node table with a fake clock: expiry, the epoch, sticky routes, failover, rejoining,
certification at the door."""

from __future__ import annotations

import itertools

import pytest
from manual_clock import ManualClock
from tracker_samples import MODEL, N_LAYERS, OTHER_RECIPE, certification, registration

from meshnet.core.errors import InvalidArgument, NoRoute, Uncertified
from meshnet.core.ids import NodeId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeRecord
from meshnet.core.tracking import NodeLoad, RouteQuery
from meshnet.tracker.placement import route_slots
from meshnet.tracker.registry import NodeRegistry

INTERVAL = 2.0


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1000.0)


class Registry(NodeRegistry):
    """The registry, with ``join`` for a node that brings a fresh id of its own (n0, n1, ...)."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock, heartbeat_interval_s=INTERVAL, epoch=7, session_ttl_s=60.0)
        self._ids = itertools.count()

    def join(self, registration: NodeRecord) -> NodeId:
        return self.register(registration, NodeId(f"n{next(self._ids)}"))


@pytest.fixture
def registry(clock: ManualClock) -> Registry:
    return Registry(clock)


def route_for(registry: Registry, session: str | None = None, **query: object) -> list[str]:
    sid = SessionId(session) if session else None
    route = registry.choose_route(RouteQuery(model=MODEL, session_id=sid, **query))  # type: ignore[arg-type]
    return list(route.node_ids)


def test_a_node_missing_three_heartbeats_leaves_routes_and_the_epoch_increments(
    registry: Registry, clock: ManualClock
) -> None:
    quiet = registry.join(registration(0, 20, address="q:1", decode_tokens_per_s=500))
    steady = registry.join(registration(0, 20, address="s:1", decode_tokens_per_s=50))
    for _ in range(3):  # 1.5 s steps are exact in binary, so "3 intervals" is exact below
        clock.advance(1.5)
        assert registry.heartbeat(steady, NodeLoad(free_sessions=8))
    assert route_for(registry) == [quiet] and registry.epoch == 7
    clock.advance(1.5)  # exactly 3 intervals since the quiet node was last heard
    assert registry.sweep() == (quiet,)
    assert registry.epoch == 8
    assert route_for(registry) == [steady]
    assert registry.heartbeat(quiet, NodeLoad()) is False


def test_heartbeats_keep_a_node_alive_and_expiry_is_not_early(registry: Registry, clock: ManualClock) -> None:
    node = registry.join(registration(0, 20))
    clock.advance(INTERVAL * 3 - 0.001)
    assert registry.sweep() == ()
    assert registry.heartbeat(node, NodeLoad(free_sessions=1))
    clock.advance(INTERVAL * 3 - 0.001)
    assert route_for(registry) == [node]
    clock.advance(0.001)
    with pytest.raises(NoRoute):
        route_for(registry)
    assert registry.epoch == 8


def test_same_session_keeps_its_route_and_a_join_does_not_move_it(registry: Registry) -> None:
    slow = registry.join(registration(0, 20, address="slow:1", decode_tokens_per_s=20))
    first = registry.choose_route(RouteQuery(MODEL, SessionId("s1")))
    fast = registry.join(registration(0, 20, address="fast:1", decode_tokens_per_s=500))
    again = registry.choose_route(RouteQuery(MODEL, SessionId("s1")))
    assert again == first and again.node_ids == (slow,)
    assert route_for(registry, "s2") == [fast]
    assert registry.epoch == 7  # joins and new sessions change no existing route


def test_a_route_change_bumps_the_epoch(registry: Registry) -> None:
    a = registry.join(registration(0, 20, address="a:1", decode_tokens_per_s=500))
    b = registry.join(registration(0, 20, address="b:1", decode_tokens_per_s=50))
    first = registry.choose_route(RouteQuery(MODEL, SessionId("s1")))
    assert first.node_ids == (a,) and first.epoch == 7
    moved = registry.choose_route(RouteQuery(MODEL, SessionId("s1"), exclude=frozenset({a})))
    assert moved.node_ids == (b,) and moved.epoch == 8 == registry.epoch
    # The new route is now the sticky one, even without the exclusion.
    assert registry.choose_route(RouteQuery(MODEL, SessionId("s1"))) == moved


def test_a_dead_node_invalidates_sticky_routes_with_a_larger_epoch(registry: Registry, clock: ManualClock) -> None:
    a = registry.join(registration(0, 20, address="a:1", decode_tokens_per_s=500))
    b = registry.join(registration(0, 20, address="b:1", decode_tokens_per_s=50))
    first = registry.choose_route(RouteQuery(MODEL, SessionId("s1")))
    clock.advance(INTERVAL * 2)
    registry.heartbeat(b, NodeLoad(free_sessions=8))
    clock.advance(INTERVAL * 1.5)  # a: 3.5 intervals silent; b: 1.5
    second = registry.choose_route(RouteQuery(MODEL, SessionId("s1")))
    assert first.node_ids == (a,) and second.node_ids == (b,)
    assert second.epoch > first.epoch


def test_failover_replans_the_whole_route_keeping_the_healthy_head_and_bumps_the_epoch(
    registry: Registry,
) -> None:
    # A lost tail is replaced by a whole new route (the client replays onto it); the planner
    # keeps the healthy head because it is still the cheapest, not because it was there.
    head = registry.join(registration(0, 10, address="h:1"))
    slower_head = registry.join(registration(0, 10, address="h:2", decode_tokens_per_s=50))
    tail = registry.join(registration(10, 20, address="t:1", decode_tokens_per_s=500))
    spare = registry.join(registration(10, 20, address="s:1", decode_tokens_per_s=50))
    first = registry.choose_route(RouteQuery(MODEL, SessionId("s1")))
    assert first.node_ids == (head, tail)
    moved = registry.choose_route(RouteQuery(MODEL, SessionId("s1"), exclude=frozenset({tail})))
    assert moved.node_ids == (head, spare) and moved.epoch == first.epoch + 1
    assert str(moved.layers) == "0:20" and slower_head not in moved.node_ids
    assert registry.choose_route(RouteQuery(MODEL, SessionId("s1"))) == moved  # now the sticky one


def test_sessions_routed_between_heartbeats_count_against_free_room(
    registry: Registry,
) -> None:
    fast = registry.join(registration(0, 20, address="f:1", decode_tokens_per_s=500))
    slow = registry.join(registration(0, 20, address="s:1", decode_tokens_per_s=50))
    registry.heartbeat(fast, NodeLoad(free_sessions=1))
    registry.heartbeat(slow, NodeLoad(free_sessions=5))
    assert route_for(registry, "s1") == [fast]
    assert route_for(registry, "s2") == [slow]  # fast has no room left until it reports again
    registry.heartbeat(fast, NodeLoad(active_sessions=1, free_sessions=1))
    assert route_for(registry, "s3") == [fast]


def test_a_route_probe_without_a_session_takes_no_room(registry: Registry) -> None:
    # The gateway asks for a route to learn its context (/v1/models): on one-slot nodes, counting
    # that as a session made the node look full to the next real request.
    fast = registry.join(registration(0, 20, address="f:1", decode_tokens_per_s=500))
    slow = registry.join(registration(0, 20, address="s:1", decode_tokens_per_s=50))
    registry.heartbeat(fast, NodeLoad(free_sessions=1))
    registry.heartbeat(slow, NodeLoad(free_sessions=5))
    assert [route_for(registry) for _ in range(3)] == [[fast]] * 3
    assert route_for(registry, "s1") == [fast]
    assert route_for(registry, "s2") == [slow]


def test_reregistering_under_the_same_id_replaces_the_old_entry(registry: Registry) -> None:
    node = registry.join(registration(0, 20, address="a:1"))
    first = registry.choose_route(RouteQuery(MODEL, SessionId("s1")))
    assert registry.register(registration(0, 20, address="a:1"), node) == node
    # The old entry's sessions are gone with it: epoch bump, no sticky route survives.
    assert registry.epoch == 8
    assert registry.choose_route(RouteQuery(MODEL, SessionId("s1"))).epoch == 8 > first.epoch


def test_a_node_restarted_on_another_port_keeps_its_one_id(registry: Registry) -> None:
    node = registry.join(registration(0, 20, address="a:1"))
    assert registry.register(registration(0, 20, address="b:1"), node) == node
    entry = registry.get(node)
    assert entry is not None and entry.record.address == "b:1"
    assert [e.node_id for e in registry.entries()] == [node] and registry.epoch == 8


def test_a_restarted_worker_with_a_new_id_replaces_its_old_entry(registry: Registry) -> None:
    old = registry.join(registration(0, 20, address="a:1"))
    new = registry.join(registration(0, 10, address="a:1"))
    assert new != old and registry.get(old) is None and registry.epoch == 8


def test_the_registry_registers_under_the_id_given_and_makes_none_up(registry: Registry) -> None:
    assert registry.register(registration(0, 20), NodeId("w-kept")) == "w-kept"
    assert registry.epoch == 7


def test_deregistering_leaves_routes_and_bumps_the_epoch(registry: Registry) -> None:
    node = registry.join(registration(0, 20))
    assert registry.deregister(node) and registry.epoch == 8
    assert not registry.deregister(node) and registry.epoch == 8


def test_list_models_reports_routability(registry: Registry) -> None:
    registry.join(registration(0, 10, address="a:1"))
    (model,) = registry.list_models()
    assert (model.name, model.nodes, model.routable, model.n_layers) == (MODEL, 1, False, N_LAYERS)
    registry.join(registration(10, 20, address="b:1"))
    (model,) = registry.list_models()
    assert (model.nodes, model.routable) == (2, True)


def test_list_models_counts_the_session_slots_of_the_heads(registry: Registry) -> None:
    registry.join(registration(0, 10, address="a:1", max_sessions=8))
    registry.join(registration(0, 10, address="b:1", max_sessions=4))
    registry.join(registration(10, 20, address="d:1", max_sessions=32))
    (model,) = registry.list_models()
    assert model.head_sessions == 12  # the gateway's default admission: what the heads can hold


def test_session_slots_are_bounded_by_the_least_covered_layer(registry: Registry) -> None:
    # The lab's shape: one-slot nodes and a spare doubling the middle range. A second head does
    # not make room for a second session while the tail still holds one.
    for start, stop, address in ((0, 6, "a:1"), (6, 14, "b:1"), (14, 20, "c:1"), (6, 14, "spare:1")):
        registry.join(registration(start, stop, address=address, max_sessions=1))
    assert registry.list_models()[0].head_sessions == 1
    registry.join(registration(0, 6, address="head-spare:1", max_sessions=1))
    assert registry.list_models()[0].head_sessions == 1  # layers 14..20 still hold one session
    assert route_slots([(LayerRange(0, 10), 3), (LayerRange(5, 20), 2)], 20) == 2
    assert route_slots([(LayerRange(0, 10), 3)], 20) == 0  # a layer nobody holds: no session fits


def test_idle_sessions_forget_their_route(registry: Registry, clock: ManualClock) -> None:
    slow = registry.join(registration(0, 20, address="slow:1", decode_tokens_per_s=20))
    assert route_for(registry, "s1") == [slow]
    fast = registry.join(registration(0, 20, address="fast:1", decode_tokens_per_s=500))
    for _ in range(31):  # 62 s: past the 60 s TTL, both nodes kept alive
        clock.advance(INTERVAL)
        registry.heartbeat(slow, NodeLoad(free_sessions=8))
        registry.heartbeat(fast, NodeLoad(free_sessions=8))
    assert route_for(registry, "s1") == [fast]


def test_registry_rejects_nonsense_settings(clock: ManualClock) -> None:
    with pytest.raises(InvalidArgument):
        NodeRegistry(clock=clock, heartbeat_interval_s=0)


def test_measured_latencies_steer_routes_and_probes_name_candidate_next_hops(registry: Registry) -> None:
    head = registry.join(registration(0, 10, address="h:1"))
    near = registry.join(registration(10, 20, address="near:1"))
    far = registry.join(registration(10, 20, address="far:1", decode_tokens_per_s=120.0))
    assert set(registry.probe_targets(head)) == {"near:1", "far:1"}
    assert registry.probe_targets(near) == ()
    # Unmeasured, the faster node wins; measured, a 200 ms round trip outweighs its speed.
    assert route_for(registry) == [head, far]
    registry.heartbeat(head, NodeLoad(free_sessions=8, peer_rtt_ms=(("near:1", 1.0), ("far:1", 200.0))))
    for node in (near, far):
        registry.heartbeat(node, NodeLoad(free_sessions=8))
    assert registry.latency_table() == {(head, near): 0.5, (head, far): 100.0}
    assert route_for(registry) == [head, near]


def test_peer_latencies_are_bounded_values() -> None:
    with pytest.raises(InvalidArgument):
        NodeLoad(peer_rtt_ms=(("a:1", -1.0),))
    with pytest.raises(InvalidArgument):
        NodeLoad(peer_rtt_ms=tuple((f"a:{i}", 1.0) for i in range(65)))


# -- certification at the door --------------------------------------------------------------------


def test_a_registration_whose_report_certifies_another_recipe_is_refused(registry: Registry) -> None:
    other = registration(0, 20, address="a:1", report=certification(OTHER_RECIPE))
    with pytest.raises(Uncertified, match=f"certification is of recipe {OTHER_RECIPE.fingerprint()}"):
        registry.join(other)
    assert registry.entries() == ()


def test_a_node_whose_split_differs_from_whole_is_refused(registry: Registry) -> None:
    broken = registration(0, 20, address="a:1", report=certification(split="cd" * 32))
    with pytest.raises(Uncertified, match="does not split bit-identically"):
        registry.join(broken)


def test_a_node_computing_other_numbers_than_its_recipes_nodes_is_refused_with_evidence(
    registry: Registry,
) -> None:
    first = registry.join(registration(0, 10, address="a:1"))
    odd = registration(10, 20, address="b:1", report=certification(whole="cd" * 32))
    with pytest.raises(Uncertified) as refused:
        registry.join(odd)
    assert f"node {first} at a:1" in refused.value.message and "ab" * 32 in refused.value.message
    assert "cd" * 32 in refused.value.message
    # Agreeing nodes join; another recipe's nodes are not compared with this one's.
    registry.join(registration(10, 20, address="c:1"))
    registry.join(
        registration(0, 20, address="d:1", recipe=OTHER_RECIPE, report=certification(OTHER_RECIPE, whole="cd" * 32))
    )
    assert len(registry.entries()) == 3


def test_once_a_recipes_nodes_have_left_a_new_digest_is_judged_afresh(registry: Registry) -> None:
    # The reference is the live nodes': one that left cannot lock its recipe out for good.
    gone = registry.join(registration(0, 20, address="a:1"))
    registry.deregister(gone)
    registry.join(registration(0, 20, address="b:1", report=certification(whole="cd" * 32)))
    assert len(registry.entries()) == 1


def test_a_refused_re_registration_still_takes_the_old_entry_out_of_routes(registry: Registry) -> None:
    # Whatever answers at that address now is not the node that was certified there.
    registry.join(registration(0, 20, address="a:1"))
    registry.join(registration(0, 20, address="b:1"))
    with pytest.raises(Uncertified):
        registry.join(registration(0, 20, address="a:1", report=certification(whole="cd" * 32)))
    assert [entry.record.address for entry in registry.entries()] == ["b:1"] and registry.epoch == 8


def test_a_restarted_node_with_another_context_is_routed_with_its_new_record(registry: Registry) -> None:
    node = registry.join(registration(0, 20, address="a:1", context=64))
    first = registry.choose_route(RouteQuery(MODEL, SessionId("s1")))
    assert first.context_tokens == 64
    registry.register(registration(0, 20, address="a:1", context=512), node)
    again = registry.choose_route(RouteQuery(MODEL, SessionId("s1")))
    assert again.context_tokens == 512 and again.hops[0].capability.n_ctx_per_session == 512
