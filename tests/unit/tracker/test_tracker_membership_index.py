"""Indexed membership against brute force: expiry, probe lists and sticky sessions, on random
operation sequences with a fake clock.

The indexes (``tracker.liveness.Deadlines``, ``tracker.peer_index``, the node index of
``tracker.session_routes``) exist only to avoid scans; each test replays random operations
on them and on a model that scans everything, as the tracker did before, and asks for the same
answers after every step.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass, field

import pytest
from manual_clock import ManualClock
from tracker_samples import OTHER_RECIPE, RECIPE, capability, certification, registration

from meshnet.core.errors import FailedPrecondition, Uncertified
from meshnet.core.events import RouteHop
from meshnet.core.ids import NodeId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeRecord
from meshnet.core.reachability import Reachability, is_routable
from meshnet.core.tracking import NodeLoad, Route
from meshnet.tracker.registry import NodeRegistry
from meshnet.tracker.session_routes import SessionRoutes

INTERVAL = 2.0
WINDOW = INTERVAL * 3
BOUNDARIES = (0, 5, 10, 20)
SEQUENCES = 150
DROPPED_TTL = 3.0
STEPS = 120


@dataclass
class ModelNode:
    record: NodeRecord
    reachability: Reachability
    last_seen: float


@dataclass
class MembershipModel:
    """The node table as the tracker kept it before issue 36: scan everything, every time."""

    nodes: dict[NodeId, ModelNode] = field(default_factory=dict)
    quarantined: set[NodeId] = field(default_factory=set)

    def register(
        self, node_id: NodeId, record: NodeRecord, reachability: Reachability, now: float, *, refused: bool = False
    ) -> None:
        """``refused``: the record is uncertified; the entries it would replace leave all the same."""
        takes = is_routable(reachability)
        for other in list(self.nodes):
            entry = self.nodes[other]
            same_address = takes and is_routable(entry.reachability) and entry.record.address == record.address
            if other == node_id or same_address:
                del self.nodes[other]
        if not refused:
            self.nodes[node_id] = ModelNode(record, reachability, now)

    def sweep(self, now: float) -> set[NodeId]:
        expired = {node_id for node_id, node in self.nodes.items() if now - node.last_seen >= WINDOW}
        for node_id in expired:
            del self.nodes[node_id]
        return expired

    def probe_targets(self, node_id: NodeId, limit: int = 16) -> tuple[str, ...]:
        node = self.nodes.get(node_id)
        if node is None or not is_routable(node.reachability):
            return ()
        mine = node.record
        followers = sorted(
            other.record.address
            for other_id, other in self.nodes.items()
            if other_id != node_id
            and is_routable(other.reachability)
            and other.record.fingerprint == mine.fingerprint
            and other.record.layers.start == mine.layers.stop
        )
        return tuple(followers[:limit])


def _random_record(rng: random.Random) -> NodeRecord:
    start, stop = sorted(rng.sample(BOUNDARIES, 2))
    recipe = rng.choice((RECIPE, OTHER_RECIPE))
    return registration(start, stop, address=f"host{rng.randrange(8)}:1", recipe=recipe)


def _register(
    registry: NodeRegistry,
    model: MembershipModel,
    node_id: NodeId,
    record: NodeRecord,
    reachability: Reachability,
    now: float,
    *,
    refused: bool,
) -> None:
    if node_id in model.quarantined:
        with pytest.raises(FailedPrecondition):
            registry.register(record, node_id, reachability)
        return
    if refused:
        with pytest.raises(Uncertified):
            registry.register(record, node_id, reachability)
    else:
        registry.register(record, node_id, reachability)
    model.register(node_id, record, reachability, now, refused=refused)


def _step(rng: random.Random, registry: NodeRegistry, model: MembershipModel, clock: ManualClock) -> None:
    node_id = NodeId(f"n{rng.randrange(12)}")
    action = rng.random()
    if action < 0.3:
        reachability: Reachability = "private" if rng.random() < 0.15 else "public"
        record, refused = _random_record(rng), rng.random() < 0.1
        if refused:  # its certification is of another recipe: refused at the door
            record = registration(
                record.layers.start, record.layers.stop, address=record.address, report=certification(OTHER_RECIPE)
            )
        _register(registry, model, node_id, record, reachability, clock.now, refused=refused)
    elif action < 0.33:
        assert registry.quarantine(node_id) == (model.nodes.pop(node_id, None) is not None)
        model.quarantined.add(node_id)
    elif action < 0.6:
        known = registry.heartbeat(node_id, NodeLoad(free_sessions=4))
        assert known == (node_id in model.nodes)
        if known:
            model.nodes[node_id].last_seen = clock.now
    elif action < 0.65:
        assert registry.deregister(node_id) == (model.nodes.pop(node_id, None) is not None)
    elif action < 0.9:
        clock.now += rng.choice((0.25, 0.5, 1.0, 2.0, 3.0))  # exact in binary: no rounding at the edge
    else:
        assert set(registry.sweep()) == model.sweep(clock.now)


@pytest.mark.parametrize("seed", range(SEQUENCES))
def test_expiry_and_probe_lists_equal_a_full_scan_on_random_operations(seed: int) -> None:
    rng, clock, model = random.Random(seed), ManualClock(1000.0), MembershipModel()
    registry = NodeRegistry(clock=clock, heartbeat_interval_s=INTERVAL, session_ttl_s=60.0)
    for _ in range(STEPS):
        _step(rng, registry, model, clock)
        # Every call sweeps first in both; here the model is brought to the same instant.
        assert set(registry.sweep()) == model.sweep(clock.now)
        assert {entry.node_id for entry in registry.entries()} == set(model.nodes)
        # The address index is exactly the routable entries' addresses (what register scanned for).
        by_address = {entry.record.address: entry.node_id for entry in registry.entries() if entry.routable}
        assert registry._by_address == by_address
        for node_id in model.nodes:
            assert registry.probe_targets(node_id) == model.probe_targets(node_id)
            assert registry.probe_targets(node_id, limit=1) == model.probe_targets(node_id, limit=1)


def _route(node_ids: list[NodeId]) -> Route:
    hops = tuple(
        RouteHop(node_id, f"{node_id}:1", LayerRange(i, i + 1), capability()) for i, node_id in enumerate(node_ids)
    )
    return Route(hops, epoch=1, model="m", quantization="q", fingerprint="f", n_layers=len(hops), ms_per_token=1.0)


class SessionModel:
    """Sticky sessions as kept before issue 36: expiry and loss of a node scan every session."""

    def __init__(self, ttl_s: float, max_sessions: int) -> None:
        self.ttl_s, self.max_sessions = ttl_s, max_sessions
        self.routes: OrderedDict[SessionId, tuple[Route, float]] = OrderedDict()
        self.dropped: OrderedDict[SessionId, float] = OrderedDict()

    def recently_dropped(self, session_id: SessionId, now: float) -> bool:
        return session_id in self.dropped and now - self.dropped[session_id] < DROPPED_TTL

    def touch(self, session_id: SessionId, route: Route, now: float) -> None:
        self.dropped.pop(session_id, None)
        self.routes[session_id] = (route, now)
        self.routes.move_to_end(session_id)
        while len(self.routes) > self.max_sessions:
            self.routes.popitem(last=False)

    def expire(self, now: float) -> None:
        for session_id in [s for s, (_, used) in self.routes.items() if now - used >= self.ttl_s]:
            del self.routes[session_id]

    def drop_through(self, gone: set[NodeId], now: float) -> None:
        for session_id in sorted(s for s, (route, _) in self.routes.items() if not gone.isdisjoint(route.node_ids)):
            del self.routes[session_id]
            self.dropped[session_id] = now
            self.dropped.move_to_end(session_id)
        for session_id in [s for s, when in self.dropped.items() if now - when >= DROPPED_TTL]:
            del self.dropped[session_id]
        while len(self.dropped) > self.max_sessions:  # bounded like the routes, oldest first
            self.dropped.popitem(last=False)


@pytest.mark.parametrize("seed", range(SEQUENCES))
def test_sticky_sessions_equal_a_full_scan_on_random_operations(seed: int) -> None:
    rng, now = random.Random(seed), 0.0
    table = SessionRoutes(ttl_s=10.0, max_sessions=12, dropped_ttl_s=DROPPED_TTL)
    model = SessionModel(ttl_s=10.0, max_sessions=12)
    nodes = [NodeId(f"n{i}") for i in range(6)]
    sessions = [SessionId(f"s{i}") for i in range(20)]
    for _ in range(STEPS):
        action = rng.random()
        if action < 0.5:
            session_id, route = rng.choice(sessions), _route(rng.sample(nodes, rng.randint(1, 3)))
            table.touch(session_id, route, now)
            model.touch(session_id, route, now)
        elif action < 0.65:
            gone = set(rng.sample(nodes, rng.randint(1, 2)))
            table.drop_through(gone, now)
            model.drop_through(gone, now)
        elif action < 0.85:
            now += rng.choice((0.5, 1.0, 4.0))
        else:
            table.expire(now)
            model.expire(now)
        assert len(table) == len(model.routes)
        for session_id in sessions:
            kept = model.routes.get(session_id)
            assert table.get(session_id) == (None if kept is None else kept[0])
        # The node index is exactly what a scan of the routes would build.
        through: dict[NodeId, set[SessionId]] = {}
        for session_id, sticky in table._routes.items():
            for node_id in sticky.route.node_ids:
                through.setdefault(node_id, set()).add(session_id)
        assert table._through == through
        table.expire(now)
        model.expire(now)
        for session_id in sessions:  # a session that lost its route is live for a while after
            assert table.recently_dropped(session_id) == model.recently_dropped(session_id, now)
