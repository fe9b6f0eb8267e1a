"""The live node table: registrations, heartbeats, expiry, the route epoch, sticky session routes.

This is the tracker's only mutable state, owned by one event loop (no locks). Which route a
query without a sticky one gets is ``tracker.route_planner``'s (over the pure planner in
``routing``); a node's entry is ``tracker.node_entry``. Time comes from an injected clock, so
expiry is tested with a fake one.

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
from dataclasses import replace

from meshnet.core.errors import FailedPrecondition, InvalidArgument
from meshnet.core.events import RouteHop
from meshnet.core.ids import NodeId, SessionId
from meshnet.core.node_record import NodeRecord
from meshnet.core.reachability import Reachability, is_routable
from meshnet.core.tracking import ModelSummary, NodeLoad, Route, RouteQuery, RouteTiming
from meshnet.tracker.admission import Admission
from meshnet.tracker.affinity import ConversationRoutes
from meshnet.tracker.certification import check_certified
from meshnet.tracker.liveness import Deadlines, Hearing
from meshnet.tracker.node_entry import Clock, NodeEntry
from meshnet.tracker.peer_index import PeerIndex
from meshnet.tracker.placement import model_summaries
from meshnet.tracker.route_costs import DEFAULT_COSTS, LatencyTable, NodeView, RoutingCosts
from meshnet.tracker.route_index import RouteIndex
from meshnet.tracker.route_planner import RoutePlanner, route_of, serves
from meshnet.tracker.routing import RoutePlan
from meshnet.tracker.session_routes import SessionRoutes
from meshnet.tracker.speeds import RouteMeasurements, forms_route, measured_nodes

logger = logging.getLogger(__name__)


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
        plan_staleness_s: float = 0.0,
    ) -> None:
        if heartbeat_interval_s <= 0 or missed_heartbeats < 1 or epoch < 0:
            raise InvalidArgument("heartbeat interval must be > 0, missed heartbeats >= 1, epoch >= 0")
        self._clock = clock
        # Plan routes over several device classes of a recipe (``--allow-mixed-routes``).
        self._mixed_devices = mixed_devices
        self.heartbeat_interval_s = heartbeat_interval_s
        self._expire_after_s = heartbeat_interval_s * missed_heartbeats
        self._epoch = epoch
        self.next_epoch: Callable[[int], int] | None = None
        """Replicas sharing a store (``tracker.etcd.membership``): the next epoch this replica may
        hand out, unique among them; a session new here then takes one too (it may have been
        routed by another replica at this epoch). None: one tracker, the epoch counts up."""
        self._costs = costs
        self._nodes: dict[NodeId, NodeEntry] = {}
        self._by_address: dict[str, NodeId] = {}
        """Routable nodes by address: a registration finds the entry it replaces without a scan."""
        self.hearing = Hearing(clock, self._expire_after_s)
        """The tracker's own deafness, which expiry forgives (``tracker.liveness``); a watcher task drives it."""
        self.admission = Admission(self.hearing.recent_lag_s, strain=self.hearing.strain)
        """The one admission every servicer on this tracker sheds by (``tracker.admission``): a
        flood on one service is pressure on all of them."""
        self._deadlines = Deadlines(self._expire_after_s)
        self._peers = PeerIndex()
        self._sticky = SessionRoutes(ttl_s=session_ttl_s, max_sessions=max_sticky_sessions)
        self._quarantined: set[NodeId] = set(quarantined)
        """Nodes an audit caught: never registered again under these ids until cleared."""
        self._conversations = ConversationRoutes()
        """Routes issued for conversations' last prefix links (``tracker.affinity``): memory only."""
        self._measured = RouteMeasurements()
        """Routes' decode times as gateways measured them: what node speeds are believed from."""
        self._index = RouteIndex(costs, clock=clock, improvement_staleness_s=plan_staleness_s)
        """What routes are planned from, kept up to date by every change of ``_nodes``."""
        self._planner = RoutePlanner(
            index=self._index,
            measured=self._measured,
            conversations=self._conversations,
            costs=costs,
            mixed_devices=mixed_devices,
            clock=clock,
            load_of=self._load_of,
        )
        """Which route a query that keeps no sticky route gets (``tracker.route_planner``)."""

    @property
    def epoch(self) -> int:
        return self._epoch

    def get(self, node_id: NodeId) -> NodeEntry | None:
        return self._nodes.get(node_id)

    def live_count(self) -> int:
        """How many nodes are live now; safe to read from another thread (a metrics scrape)."""
        return len(self._nodes)

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
        self._index.refresh(self._measured.recent(self._clock()), self._measured.version)
        return self._index.views()

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

    def register(
        self, record: NodeRecord, node_id: NodeId, reachability: Reachability = "public", *, pending: bool = False
    ) -> NodeId:
        """Add the node ``node_id`` (its own id, see ``NodeId``; the registry makes none up).

        Raises ``Uncertified`` when the record's certification does not certify what it
        registers, or disagrees with the recipe's live nodes (``tracker.certification``). A
        secured tracker registers a node routable only once it answered at its address under its
        own certificate (``tracker.dial_back``); a ``private`` one replaces only its own entry.

        ``pending``: the caller still has work to do before the node is told it is registered (the
        store, the epoch): its window starts only at ``heard``, so a slow store never expires a
        node mid-registration. The caller must call ``heard`` however its work ends."""
        self.sweep()
        self.check_admissible(node_id)
        # One id is one live node, and so is one address: a node that registers again (restarted,
        # or on another port) or another node now at its address replaces the old entry, and the
        # sessions routed to that entry are gone either way, so it leaves routes, even when the
        # new one is refused (whatever answers at that address is not the old node: on a secured
        # tracker the dial-back proved that the new one does).
        # A private node proved nothing about its address: it takes it from nobody.
        takes_address = is_routable(reachability)
        stale = [node_id]
        if takes_address and record.address in self._by_address:
            stale.append(self._by_address[record.address])
        self._remove(stale, "re-registered")
        # Only nodes proven at their address speak for a recipe: a private one could be anybody's.
        # They come from the peer index: a mass join must not scan the table once per node.
        recipe = self._peers.recipe_nodes(record.fingerprint)
        check_certified(record, ((peer, self._nodes[peer].record) for peer in recipe))
        now = self._clock()
        self._nodes[node_id] = NodeEntry(node_id, record, registered_at=now, last_seen=now, reachability=reachability)
        if not pending:
            self._deadlines.heard(node_id, self.hearing.listening_now())
        if is_routable(reachability):
            self._peers.add(node_id, record)
            self._by_address[record.address] = node_id
        self._index.put(self._nodes[node_id])
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
            self._index.put(self._nodes[node_id])
        self.sweep()
        return entry is not None

    def holds_session(self, session_id: SessionId) -> bool:
        """Whether ``session_id`` is a live session (``tracker.admission``): it has a sticky route,
        or had one until a node on it was lost a moment ago (it comes back for a new route)."""
        return self._sticky.get(session_id) is not None or self._sticky.recently_dropped(session_id)

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
        # The tracker's own recent deafness is not the nodes' silence (tracker.liveness).
        expired = self._deadlines.expired(self.hearing.listening_now(), self.hearing.grace_s())
        self._remove(expired, "missed heartbeats")
        self._sticky.expire(self._clock())
        return expired

    def latency_table(self) -> LatencyTable:
        """One-way latency between live nodes, from the round trips they measured (RTT / 2): a
        snapshot of the table routes are planned with (``tracker.route_index``)."""
        return dict(self._index.latency)

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
        sticky = self._sticky.get(query.session_id) if query.session_id else None
        if sticky is not None and not serves(sticky, query.model):
            sticky = None  # the session asks for another model now: a fresh session in effect
        if sticky is not None and self._all_alive(sticky.hops, query.exclude):
            self._touch(query.session_id, sticky)
            return sticky
        plan = self._planner.plan(query, latency_ms)
        if sticky is not None or (self.next_epoch is not None and query.session_id):
            self._step_epoch()  # the session's route changed: frames of its old route are now stale
        route = route_of(plan, self._epoch)
        if query.session_id is None:
            return route  # a probe (what context does a route have?): it opens no session
        self._count_routed(plan)
        self._touch(query.session_id, route)
        if not query.unbilled:
            self._conversations.remember(query.prefix_chain, route.node_ids, self._clock())
        return route

    def _load_of(self, node_id: NodeId) -> NodeLoad | None:
        entry = self._nodes.get(node_id)
        return entry.load if entry else None

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
            self._index.drop(node_id)
            if entry.routable:
                self._peers.remove(node_id, entry.record)
                if self._by_address.get(entry.record.address) == node_id:
                    del self._by_address[entry.record.address]
        self._sticky.drop_through(gone, self._clock())
        self._step_epoch()
        logger.info("nodes %s left routes (%s); epoch %d", ", ".join(sorted(gone)), reason, self._epoch)

    def _step_epoch(self) -> None:
        self._epoch = self._epoch + 1 if self.next_epoch is None else self.next_epoch(self._epoch)

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
            self._index.put(self._nodes[hop.node_id])
