"""The live node table: registrations, heartbeats, expiry, the route epoch, sticky session routes.

This is the tracker's only mutable state, owned by one event loop (no locks). Route choice
is delegated to the pure planner in ``routing``; time comes from an injected clock, so expiry
is tested with a fake one.

The epoch is a counter that never goes down. It increments when a node leaves routes (missed
heartbeats, deregistration, or being replaced by a new registration at the same address or id)
and when a session's route changes, so a changed route always carries a larger epoch than the
one it replaces and shards can refuse frames of the old route. A join does not increment it:
it invalidates no route.

Stickiness: a session keeps its route while every node on it is alive, not excluded by the
caller and unchanged, even if the epoch moved for another reason, because moving a live session
throws away its KV cache and costs a full replay (``tracker.session_routes`` keeps them). A new
session whose prompt continues an earlier one's keeps that one's route too while it has room
(``tracker.affinity``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from meshnet.core.errors import FailedPrecondition, InvalidArgument
from meshnet.core.events import RouteHop
from meshnet.core.ids import NodeId, SessionId
from meshnet.core.node_record import NodeRecord
from meshnet.core.reachability import Reachability, is_routable
from meshnet.core.tracking import ModelSummary, NodeLoad, Route, RouteQuery, RouteTiming
from meshnet.tracker.affinity import ConversationRoutes, PrefixRouting, plan_of, prefer_held_prefix
from meshnet.tracker.certification import check_certified
from meshnet.tracker.claims import believed_views
from meshnet.tracker.liveness import Deadlines, Hearing
from meshnet.tracker.peer_index import PeerIndex
from meshnet.tracker.placement import model_summaries
from meshnet.tracker.routing import (
    DEFAULT_COSTS,
    LatencyTable,
    NodeView,
    RoutePlan,
    RoutingCosts,
    choose_model_route,
)
from meshnet.tracker.session_routes import SessionRoutes
from meshnet.tracker.speeds import RouteMeasurements, forms_route, measured_nodes

logger = logging.getLogger(__name__)

Clock = Callable[[], float]
"""Seconds on a monotonic scale; ``time.monotonic`` in production, a fake in tests."""


@dataclass(frozen=True)
class NodeEntry:
    node_id: NodeId
    record: NodeRecord
    registered_at: float
    last_seen: float
    load: NodeLoad | None = None
    routed_since_heartbeat: int = 0
    """Sessions routed here since its last heartbeat. They are subtracted from the node's last
    reported free sessions, so a burst between two heartbeats does not all land on the fastest
    node; the next heartbeat's report already counts them."""
    reachability: Reachability = "public"
    """How others dial it (``core.reachability``): a ``private`` node is in the table (status,
    heartbeats) but never in a route, a probe list or the latency table."""

    @property
    def routable(self) -> bool:
        return is_routable(self.reachability)

    def view(self) -> NodeView:
        capability = self.record.capability
        reported_free = self.load.free_sessions if self.load else capability.max_sessions
        return NodeView(
            node_id=self.node_id,
            record=self.record,
            decode_tokens_per_s=capability.decode_tokens_per_s,
            free_sessions=reported_free - self.routed_since_heartbeat,
            queue_depth=self.load.queue_depth if self.load else 0,
        )


class NodeRegistry:
    """Live nodes and sessions' routes. Call from one event loop only."""

    def __init__(
        self,
        *,
        clock: Clock,
        heartbeat_interval_s: float,
        missed_heartbeats: int = 3,
        epoch: int = 0,
        session_ttl_s: float = 600.0,
        max_sticky_sessions: int = 100_000,
        costs: RoutingCosts = DEFAULT_COSTS,
        quarantined: Iterable[NodeId] = (),
        mixed_devices: bool = False,
    ) -> None:
        if heartbeat_interval_s <= 0 or missed_heartbeats < 1 or epoch < 0:
            raise InvalidArgument("heartbeat interval must be > 0, missed heartbeats >= 1, epoch >= 0")
        self._clock = clock
        # Plan routes over several device classes of a recipe (``--allow-mixed-routes``).
        self._mixed_devices = mixed_devices
        self.heartbeat_interval_s = heartbeat_interval_s
        self._expire_after_s = heartbeat_interval_s * missed_heartbeats
        self._epoch = epoch
        self._costs = costs
        self._nodes: dict[NodeId, NodeEntry] = {}
        self.hearing = Hearing(clock)
        """The listening clock expiry is judged on (``tracker.liveness``); the sweep task drives it."""
        self._deadlines = Deadlines(self._expire_after_s)
        self._peers = PeerIndex()
        self._sticky = SessionRoutes(ttl_s=session_ttl_s, max_sessions=max_sticky_sessions)
        self._quarantined: set[NodeId] = set(quarantined)
        """Nodes an audit caught: never registered again under these ids until cleared."""
        self._conversations = ConversationRoutes()
        """Routes issued for conversations' last prefix links (``tracker.affinity``): memory only."""
        self._measured = RouteMeasurements()
        """Routes' decode times as gateways measured them: what node speeds are believed from."""
        self._beliefs: tuple[object, dict[NodeId, float]] | None = None
        """The last believed rates and what they were computed from (the fit is not free)."""

    @property
    def epoch(self) -> int:
        return self._epoch

    def get(self, node_id: NodeId) -> NodeEntry | None:
        return self._nodes.get(node_id)

    def entries(self) -> tuple[NodeEntry, ...]:
        """Every live node's entry, for the status service."""
        return tuple(self._nodes.values())

    @property
    def expire_after_s(self) -> float:
        return self._expire_after_s

    def now(self) -> float:
        return self._clock()

    def node_views(self) -> tuple[NodeView, ...]:
        # Speeds are believed from what routes measured, self-declared ones capped (tracker.claims).
        views = tuple(entry.view() for entry in self._nodes.values() if entry.routable)
        rates = self._believed_rates(views)
        return tuple(replace(view, decode_tokens_per_s=rates[view.node_id]) for view in views)

    def observe_route(self, timing: RouteTiming) -> bool:
        """Take a gateway's timing of a route; False (ignored) unless its hops are live and chain."""
        self.sweep()
        entries = [self._nodes.get(node_id) for node_id in timing.hops]
        live = [entry for entry in entries if entry is not None and entry.routable]
        if len(live) != len(entries) or not forms_route(tuple(entry.record for entry in live)):
            return False
        self._measured.observe(timing, self._clock())
        return True

    def measured_nodes(self) -> frozenset[NodeId]:
        """Live nodes believed at what routes measured rather than at what they claim."""
        return measured_nodes(self._measured.recent(self._clock()), self._nodes)

    def _believed_rates(self, views: tuple[NodeView, ...]) -> dict[NodeId, float]:
        latency = self.latency_table()
        routes = self._measured.recent(self._clock())
        claims = tuple((view.node_id, view.decode_tokens_per_s, view.layers, view.fingerprint) for view in views)
        key = (self._measured.version, claims, tuple(sorted(latency.items())))
        if self._beliefs is None or self._beliefs[0] != key:
            believed = believed_views(views, routes, latency_ms=latency, costs=self._costs)
            self._beliefs = (key, {view.node_id: view.decode_tokens_per_s for view in believed})
        return self._beliefs[1]

    def register(self, record: NodeRecord, node_id: NodeId, reachability: Reachability = "public") -> NodeId:
        """Add the node ``node_id`` (its own id, see ``NodeId``; the registry makes none up).

        Raises ``Uncertified`` when the record's certification does not certify what it
        registers, or disagrees with the recipe's live nodes (``tracker.certification``). A
        secured tracker registers a node routable only once it answered at its address under its
        own certificate (``tracker.dial_back``); a ``private`` one replaces only its own entry."""
        self.sweep()
        self.check_admissible(node_id)
        # One id is one live node, and so is one address: a node that registers again (restarted,
        # or on another port) or another node now at its address replaces the old entry, and the
        # sessions routed to that entry are gone either way, so it leaves routes, even when the
        # new one is refused (whatever answers at that address is not the old node: on a secured
        # tracker the dial-back proved that the new one does).
        # A private node proved nothing about its address: it takes it from nobody.
        takes_address = is_routable(reachability)
        stale = [
            entry.node_id
            for entry in self._nodes.values()
            if entry.node_id == node_id or (takes_address and entry.routable and entry.record.address == record.address)
        ]
        self._remove(stale, "re-registered")
        # Only nodes proven at their address speak for a recipe: a private one could be anybody's.
        check_certified(record, ((entry.node_id, entry.record) for entry in self._nodes.values() if entry.routable))
        now = self._clock()
        self._nodes[node_id] = NodeEntry(node_id, record, registered_at=now, last_seen=now, reachability=reachability)
        self._deadlines.heard(node_id, self.hearing.listening_now())
        if is_routable(reachability):
            self._peers.add(node_id, record)
        return node_id

    def adopt_epoch(self, known_epoch: int) -> bool:
        """Move above ``known_epoch``, an epoch a registering node says it was told, if this one
        is not above it yet; True if it moved.

        A node only knows epochs a tracker handed out, so a larger one means this tracker lost
        the state it had (an emptied database and epoch file): without moving, every route it
        plans is older than what the nodes accept. A node can push the epoch up this way, as it
        can by registering again; it cannot push it down.
        """
        if known_epoch < self._epoch:
            return False
        logger.warning(
            "a node was told epoch %d, this tracker is at %d: its state was lost; moving to %d",
            known_epoch,
            self._epoch,
            known_epoch + 1,
        )
        self._epoch = known_epoch + 1
        return True

    def follow_epoch(self, epoch: int) -> bool:
        """Move up to ``epoch``, one another replica of this swarm handed out
        (``tracker.etcd.membership``); never down. True if it moved."""
        if epoch <= self._epoch:
            return False
        self._epoch = epoch
        return True

    def check_admissible(self, node_id: NodeId) -> None:
        """Refuse (FailedPrecondition) an id an audit quarantined."""
        if node_id in self._quarantined:
            raise FailedPrecondition(
                f"node {node_id} is quarantined (its output disagreed with other nodes' in an audit); "
                "it stays out of routes until an operator clears it"
            )

    def heartbeat(self, node_id: NodeId, load: NodeLoad) -> bool:
        """Record a heartbeat; False means the node is unknown (expired or never registered)."""
        entry = self._nodes.get(node_id)
        if entry is not None:
            # Heard before the sweep: a heartbeat that arrives late still proves its sender alive,
            # and must not expire it (it would register again, with every other late one).
            self._nodes[node_id] = replace(entry, last_seen=self._clock(), load=load, routed_since_heartbeat=0)
            self._deadlines.heard(node_id, self.hearing.listening_now())
        self.sweep()
        return entry is not None

    def holds_session(self, session_id: SessionId) -> bool:
        """Whether ``session_id`` has a sticky route: it is a live session (``tracker.admission``)."""
        return self._sticky.get(session_id) is not None

    def heard(self, node_id: NodeId) -> bool:
        """A heartbeat the tracker is too busy to read whole (``tracker.admission``) still proves
        the node alive: its window starts again, its load report waits for the next one."""
        if node_id not in self._nodes:
            return False
        self._deadlines.heard(node_id, self.hearing.listening_now())
        return True

    def deregister(self, node_id: NodeId) -> bool:
        self.sweep()
        if node_id not in self._nodes:
            return False
        self._remove([node_id], "deregistered")
        return True

    @property
    def quarantined(self) -> frozenset[NodeId]:
        return frozenset(self._quarantined)

    def quarantine(self, node_id: NodeId) -> bool:
        """Take ``node_id`` out of routes for good; True if it was live. Idempotent."""
        self.sweep()
        self._quarantined.add(node_id)
        known = node_id in self._nodes
        self._remove([node_id], "quarantined")
        return known

    def clear_quarantine(self, node_id: NodeId) -> bool:
        """Let ``node_id`` register again; True if it was quarantined."""
        if node_id not in self._quarantined:
            return False
        self._quarantined.discard(node_id)
        return True

    def sweep(self) -> tuple[NodeId, ...]:
        """Drop nodes that missed their heartbeats and sessions idle past their TTL."""
        # Silence is judged on the listening clock: the tracker's own stalls are not the nodes'.
        expired = self._deadlines.expired(self.hearing.listening_now())
        self._remove(expired, "missed heartbeats")
        self._sticky.expire(self._clock())
        return expired

    def latency_table(self) -> LatencyTable:
        """One-way latency between live nodes, from the round trips they measured (RTT / 2)."""
        by_address = {entry.record.address: node_id for node_id, entry in self._nodes.items() if entry.routable}
        table: dict[tuple[NodeId, NodeId], float] = {}
        for node_id, entry in self._nodes.items():
            for address, rtt_ms in entry.load.peer_rtt_ms if entry.load else ():
                peer = by_address.get(address)
                if peer is not None:
                    table[(node_id, peer)] = rtt_ms / 2.0
        return table

    def probe_targets(self, node_id: NodeId, limit: int = 16) -> tuple[str, ...]:
        """Addresses a node should measure: live nodes of its recipe that could follow it in a route."""
        entry = self._nodes.get(node_id)
        if entry is None or not entry.routable:
            return ()  # a private node's measurements route nothing: no route passes through it
        return self._peers.followers(node_id, entry.record, limit)

    def choose_route(self, query: RouteQuery, latency_ms: LatencyTable | None = None) -> Route:
        """The session's current route if it still holds, else a newly planned one.

        Seams are costed by the latencies the nodes measured (``latency_table``) unless given.
        Every hop carries its node's capability, from the record it registered.
        """
        self.sweep()
        if latency_ms is None:
            latency_ms = self.latency_table()
        sticky = self._sticky.get(query.session_id) if query.session_id else None
        if sticky is not None and not _serves(sticky, query.model):
            sticky = None  # the session asks for another model now: a fresh session in effect
        if sticky is not None and self._all_alive(sticky.hops, query.exclude):
            self._touch(query.session_id, sticky)
            return sticky
        plan = self._plan(query, latency_ms)
        if sticky is not None:
            self._epoch += 1  # the session's route changed: frames of its old route are now stale
        route = _route_of(plan, self._epoch)
        if query.session_id is None:
            return route  # a probe (what context does a route have?): it opens no session
        self._count_routed(plan)
        self._touch(query.session_id, route)
        if not query.unbilled:
            self._conversations.remember(query.prefix_chain, route.node_ids, self._clock())
        return route

    def _plan(self, query: RouteQuery, latency_ms: LatencyTable) -> RoutePlan:
        """The route the request's conversation was given, while it holds and has room; else the
        planner's, or one whose head holds a prefix of the prompt (``tracker.affinity``)."""
        views, chain = self.node_views(), query.prefix_chain
        known = self._conversations.recall(chain, self._clock()) if chain else None
        if known is not None:
            kept = plan_of(known, views, query.model, latency_ms=latency_ms, exclude=query.exclude, costs=self._costs)
            if kept is not None:
                return kept
        base = choose_model_route(
            views,
            query.model,
            latency_ms=latency_ms,
            exclude=query.exclude,
            costs=self._costs,
            mixed_devices=self._mixed_devices,
        )
        if not chain:
            return base
        # Tips live in each node's last load report: memory only, gone with the node.
        tips = {node_id: dict(entry.load.prefix_tips) for node_id, entry in self._nodes.items() if entry.load}
        prefix = PrefixRouting(chain, tips)
        return prefer_held_prefix(base, views, prefix, latency_ms=latency_ms, exclude=query.exclude, costs=self._costs)

    def list_models(self) -> tuple[ModelSummary, ...]:
        self.sweep()
        return model_summaries(self.node_views(), self._costs)

    def _remove(self, node_ids: Iterable[NodeId], reason: str) -> None:
        gone = {node_id for node_id in node_ids if node_id in self._nodes}
        if not gone:
            return
        for node_id in gone:
            entry = self._nodes.pop(node_id)
            self._deadlines.forget(node_id)
            if entry.routable:
                self._peers.remove(node_id, entry.record)
        self._sticky.drop_through(gone)
        self._epoch += 1
        logger.info("nodes %s left routes (%s); epoch %d", ", ".join(sorted(gone)), reason, self._epoch)

    def _all_alive(self, hops: Iterable[RouteHop], exclude: frozenset[NodeId]) -> bool:
        for hop in hops:
            entry = self._nodes.get(hop.node_id)
            if entry is None or entry.node_id in exclude or not entry.routable:
                return False
        return True

    def _touch(self, session_id: SessionId | None, route: Route) -> None:
        if session_id is None:
            return
        self._sticky.touch(session_id, route, self._clock())

    def _count_routed(self, plan: RoutePlan) -> None:
        for hop in plan.hops:
            entry = self._nodes[hop.node_id]
            self._nodes[hop.node_id] = replace(entry, routed_since_heartbeat=entry.routed_since_heartbeat + 1)


def _serves(route: Route, model: str) -> bool:
    return model in (route.model, route.fingerprint)


def _route_of(plan: RoutePlan, epoch: int) -> Route:
    return Route(
        hops=plan.hops,
        epoch=epoch,
        model=plan.model,
        quantization=plan.quantization,
        fingerprint=plan.fingerprint,
        n_layers=plan.n_layers,
        ms_per_token=plan.ms_per_token,
    )
