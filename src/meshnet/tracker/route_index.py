"""What the route planner reads, kept up to date as nodes change instead of rebuilt per route.

The registry calls ``put`` when a node registers, heartbeats or is routed to, and ``drop`` when
it leaves; a route request then reads, without scanning the swarm:

* the nodes of the asked model, in registration order, as ``NodeView`` s with the decode rates
  the tracker believes (``tracker.claims``);
* the seam latency table (``SeamLatencies``), each reporter's row replaced by its heartbeat's
  ``peer_rtt_ms`` and indexed by the node entered, as the planner reads it;
* a plan cache per model (``PlanCache``), invalidated by what can change a plan (see there).

Believed rates are a fit over every measured route (``tracker.claims``), not free: they are
recomputed only when what they come from changes (membership, the measured routes, or the
measured latency of a seam on one of those routes by more than the plan cache's tolerance),
never because some other round trip moved. The registry calls ``refresh`` before reading.
Even then only the fit of the measured routes is redone whole; what membership decides of the
beliefs (capped claims, the recipes' medians) is kept per membership (``claims.Claims``) and
only the nodes a new measurement can move are believed again (``claims.believe``), so a route
timed between two routes costs the next one the fit and the moved nodes, not a pass over
every node per measured one.

Call from one event loop only, like the registry that owns it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Protocol

from meshnet.core.ids import NodeId
from meshnet.core.node_record import NodeRecord
from meshnet.core.tracking import NodeLoad
from meshnet.tracker.claims import Beliefs, Claims, believe
from meshnet.tracker.plan_cache import PlanCache
from meshnet.tracker.route_costs import NO_SEAMS, NodeView, RoutingCosts, SeamLatencies
from meshnet.tracker.routing import PlannedViews, RoutePlan
from meshnet.tracker.span_index import SpanIndex
from meshnet.tracker.speeds import RouteMeasure


class IndexedNode(Protocol):
    """The registry's entry for one node, as far as the index reads it."""

    @property
    def node_id(self) -> NodeId: ...
    @property
    def record(self) -> NodeRecord: ...
    @property
    def load(self) -> NodeLoad | None: ...
    @property
    def routable(self) -> bool: ...
    def view(self) -> NodeView: ...


NO_ROW: Mapping[str, float] = MappingProxyType({})


class IndexedLatencies(SeamLatencies):
    """One-way latencies between live routable nodes (RTT / 2), by the node entered.

    Every node's heartbeat reports round trips by address; a private node's reports count (it
    measured them) but no seam leads into it. A row is replaced whole at each heartbeat."""

    def __init__(self) -> None:
        self._rows: dict[NodeId, dict[str, float]] = {}
        """Each reporter's last round trips, by peer address (the last of duplicates wins)."""
        self._reporters: dict[str, set[NodeId]] = {}
        self._at: dict[str, NodeId] = {}
        """Routable live nodes by address: the peers a reported address can name."""
        self._into: dict[NodeId, dict[NodeId, float]] = {}
        self._size = 0

    def into(self, after: NodeId) -> Mapping[NodeId, float]:
        return self._into.get(after, NO_SEAMS)

    def __iter__(self) -> Iterator[tuple[NodeId, NodeId]]:
        return ((before, after) for after, row in self._into.items() for before in row)

    def __len__(self) -> int:
        return self._size

    def row(self, before: NodeId) -> dict[str, float]:
        """``before``'s reported round trips by address (a copy)."""
        return dict(self._rows.get(before, {}))

    def reported(self, before: NodeId) -> Mapping[str, float]:
        """``before``'s reported round trips by address, not copied: a row is replaced whole by
        each report, never changed in place, so the reference stays what was reported."""
        return self._rows.get(before, NO_ROW)

    def reported_rows(self, nodes: Iterable[NodeId]) -> dict[NodeId, Mapping[str, float]]:
        """``reported`` of each of ``nodes``, in one pass: a replan takes every node's of its model."""
        rows = self._rows
        return {node_id: rows.get(node_id, NO_ROW) for node_id in nodes}

    def set_row(self, before: NodeId, peer_rtt_ms: Sequence[tuple[str, float]]) -> None:
        """Replace what ``before`` reported with its latest round trips."""
        self.drop_row(before)
        row = dict(peer_rtt_ms)
        if not row:
            return
        self._rows[before] = row
        for address, rtt_ms in row.items():
            self._reporters.setdefault(address, set()).add(before)
            after = self._at.get(address)
            if after is not None:
                self._set(before, after, rtt_ms / 2.0)

    def drop_row(self, before: NodeId) -> None:
        for address in self._rows.pop(before, {}):
            self._reporters[address].discard(before)
            if not self._reporters[address]:
                del self._reporters[address]
            after = self._at.get(address)
            if after is not None:
                self._unset(before, after)

    def add_peer(self, node_id: NodeId, address: str) -> None:
        """``node_id`` is now routable at ``address``: the round trips reported to it count."""
        self._at[address] = node_id
        for before in self._reporters.get(address, ()):
            self._set(before, node_id, self._rows[before][address] / 2.0)

    def drop_peer(self, node_id: NodeId, address: str) -> None:
        if self._at.get(address) != node_id:
            return
        del self._at[address]
        self._size -= len(self._into.pop(node_id, {}))

    def _set(self, before: NodeId, after: NodeId, latency_ms: float) -> None:
        row = self._into.setdefault(after, {})
        self._size += before not in row
        row[before] = latency_ms

    def _unset(self, before: NodeId, after: NodeId) -> None:
        row = self._into.get(after)
        if row is not None and row.pop(before, None) is not None:
            self._size -= 1
            if not row:
                del self._into[after]


@dataclass(frozen=True)
class _Beliefs:
    key: tuple[int, int]
    """The membership and measured routes' versions the rates were believed at."""
    seams: tuple[float | None, ...]
    """The measured routes' seam latencies they were believed with."""
    beliefs: Beliefs


class RouteIndex:
    """Per model, the routable live nodes with believed rates; the seam latency table."""

    def __init__(
        self,
        costs: RoutingCosts,
        *,
        clock: Callable[[], float],
        latency_tolerance_ms: float = 1.0,
        improvement_staleness_s: float = 0.0,
    ) -> None:
        self._costs = costs
        self.latency = IndexedLatencies()
        self._base: dict[NodeId, NodeView] = {}
        """Each routable node's view with its claimed rate, in registration order."""
        self._by_model: dict[str, dict[NodeId, None]] = {}
        """Node ids by model name, in registration order (a dict as an ordered set)."""
        self._names: dict[str, dict[str, int]] = {}
        """Model names by recipe fingerprint, with how many nodes serve each."""
        self._recipes: dict[str, dict[str, int]] = {}
        """Recipe fingerprints by model name, with how many nodes serve each."""
        self._planned: dict[NodeId, NodeView] = {}
        """Views with believed rates, built on demand; emptied when the beliefs move."""
        self._spans = SpanIndex(costs)
        """The planned views by recipe and span, for the planner (``routing.PlannedViews``)."""
        self._priced: dict[NodeId, Mapping[str, float]] = {}
        """Each routable node's round trips as its model's last plan priced them: a report is
        compared with these, not with the last one, so small moves cannot add up unseen."""
        self._beliefs: _Beliefs | None = None
        self._claims: tuple[int, Claims] | None = None
        """What membership decides of the beliefs, and the membership version it was taken at."""
        self.membership = 0
        """Moves whenever a routable node joins or leaves: what claims and candidates depend on."""
        self.cache = PlanCache(
            clock=clock, latency_tolerance_ms=latency_tolerance_ms, improvement_staleness_s=improvement_staleness_s
        )

    def put(self, entry: IndexedNode) -> None:
        """``entry`` registered, heartbeat or was routed to: take its current record and load."""
        self.latency.set_row(entry.node_id, entry.load.peer_rtt_ms if entry.load else ())
        if not entry.routable:
            return
        view = entry.view()
        before = self._base.get(view.node_id)
        if before is None:
            self.latency.add_peer(view.node_id, view.record.address)
            self._by_model.setdefault(view.model, {})[view.node_id] = None
            _count(self._names, view.fingerprint, view.model, +1)
            _count(self._recipes, view.model, view.fingerprint, +1)
            self.membership += 1
            self.cache.improved(view.model)  # a new candidate can only make some chain cheaper
        else:
            self._reprice(before, view)
        self._base[view.node_id] = view
        self._planned.pop(view.node_id, None)
        self._spans.stale(view.node_id)

    def _reprice(self, before: NodeView, view: NodeView) -> None:
        """Tell the plan cache what a known node's new report can do to its model's plans: a node
        on a cached plan that changes anything the planner prices forgets them; a node off every
        plan matters only where its cost may have fallen (``PlanCache.improved``)."""
        priced = self._priced.get(view.node_id)
        moved = priced is not None and _rows_differ(
            priced, self.latency.reported(view.node_id), self.cache.latency_tolerance_ms
        )
        if self.cache.uses(view.model, view.node_id):
            if moved or _costs_differ(before, view):
                self.cache.forget(view.model)
        elif moved or priced is None or _cost_may_fall(before, view):
            # Off the plans, a costlier node leaves them the cheapest (every other chain only
            # got dearer); a cheaper one, or a seam re-measured, may beat them.
            self.cache.improved(view.model)

    def drop(self, node_id: NodeId) -> None:
        """``node_id`` left: no route, no seam and no belief counts it any more."""
        self.latency.drop_row(node_id)
        view = self._base.pop(node_id, None)
        if view is None:
            return
        self.latency.drop_peer(node_id, view.record.address)
        models = self._by_model[view.model]
        del models[node_id]
        if not models:
            del self._by_model[view.model]
        _count(self._names, view.fingerprint, view.model, -1)
        _count(self._recipes, view.model, view.fingerprint, -1)
        self._planned.pop(node_id, None)
        self._spans.stale(node_id)
        self._priced.pop(node_id, None)
        self.membership += 1
        if self.cache.uses(view.model, node_id):
            self.cache.forget(view.model)  # a plan without it is needed; off the plans it cost nothing

    def model_names(self, model: str) -> tuple[str, ...]:
        """The model names a route for ``model`` (a name, or a recipe fingerprint) can use:
        every name its recipes are served under, and theirs in turn; () when none serves it."""
        names = {model} if model in self._by_model else set(self._names.get(model, {}))
        frontier = list(names)
        while frontier:
            for fingerprint in self._recipes.get(frontier.pop(), {}):
                for name in self._names[fingerprint]:
                    if name not in names:
                        names.add(name)
                        frontier.append(name)
        return tuple(sorted(names))

    def views(self) -> tuple[NodeView, ...]:
        """Every routable node, with the rates the tracker believes (as of ``refresh``)."""
        return tuple(self._planned_view(node_id) for node_id in self._base)

    def views_of(self, model: str) -> tuple[NodeView, ...]:
        """The nodes of every model name a route for ``model`` can use (``model_names``), with
        believed rates (as of ``refresh``); every node when none serves it, so that the
        planner's refusal can say what is served. Planning over this subset chooses what
        planning over every node would: the planner and the prefix routes only ever consider
        nodes of the asked model's recipes, all of which are in it. Of one model name, they come
        indexed for the planner (``routing.PlannedViews``): no other name serves their recipes."""
        names = self.model_names(model)
        if len(names) == 1:
            planned = self._planned  # one dict read per node: a replan reads thousands
            of_model = (planned.get(node_id) or self._planned_view(node_id) for node_id in self._by_model[names[0]])
            return PlannedViews(of_model, self._spans.spans(self._planned_if_routable), self._costs)
        views = self.views()
        return tuple(view for view in views if view.model in names) if names else views

    def _planned_if_routable(self, node_id: NodeId) -> NodeView | None:
        return self._planned_view(node_id) if node_id in self._base else None

    def _planned_view(self, node_id: NodeId) -> NodeView:
        view = self._planned.get(node_id)
        if view is None:
            rates = self._beliefs.beliefs.rates if self._beliefs else {}
            view = replace(self._base[node_id], decode_tokens_per_s=rates[node_id])
            self._planned[node_id] = view
        return view

    def refresh(self, routes: Sequence[RouteMeasure], routes_version: int) -> None:
        """Believe the rates again if what they come from changed: membership (claims), the
        measured routes, or the measured latency of a seam on one of them by more than the plan
        cache's tolerance (the same staleness a cached plan allows, see ``PlanCache``)."""
        seams = tuple(
            self.latency.get((before, after))
            for route in routes
            for before, after in zip(route.hops, route.hops[1:], strict=False)
        )
        key = (self.membership, routes_version)
        if self._beliefs is not None and self._beliefs.key == key and self._near(self._beliefs.seams, seams):
            return
        if self._claims is None or self._claims[0] != self.membership:
            self._claims = (self.membership, Claims.of(self._base.values()))
        before = self._beliefs.beliefs if self._beliefs else None
        # Only the nodes a new measurement can move are believed again (``claims.believe``).
        beliefs = believe(self._claims[1], routes, latency_ms=self.latency, costs=self._costs, before=before)
        # A cached plan reads the nodes of its one model name only (``views_of``): plans of
        # models no moved node serves still hold, and so do those no moved node is on unless
        # some node is believed faster than before.
        old_rates = before.rates if before else {}
        for node_id in beliefs.changed:
            self._planned.pop(node_id, None)
            self._spans.stale(node_id)
            model = self._base[node_id].model
            if self.cache.uses(model, node_id):
                self.cache.forget(model)
            elif node_id not in old_rates or beliefs.rates[node_id] > old_rates[node_id]:
                self.cache.improved(model)
        self._beliefs = _Beliefs(key, seams, beliefs)

    def plan(self, name: str, asked: str, mixed: bool, planner: Callable[[], RoutePlan]) -> RoutePlan:
        """The plan cache's plan of ``asked`` (served under ``name``), the round trips it was
        made with kept as what later reports are compared with."""

        def priced_planner() -> RoutePlan:
            self._priced.update(self.latency.reported_rows(self._by_model.get(name, ())))
            return planner()

        return self.cache.plan(name, asked, mixed, priced_planner)

    def _near(self, before: tuple[float | None, ...], after: tuple[float | None, ...]) -> bool:
        tolerance = self.cache.latency_tolerance_ms
        if len(before) != len(after):
            return False
        for old, new in zip(before, after, strict=True):
            if (old is None) != (new is None) or (old is not None and new is not None and abs(new - old) > tolerance):
                return False
        return True


def _count(counts: dict[str, dict[str, int]], key: str, value: str, delta: int) -> None:
    """Count ``value`` under ``key`` up or down, forgetting what falls to zero."""
    values = counts.setdefault(key, {})
    values[value] = values.get(value, 0) + delta
    if not values[value]:
        del values[value]
        if not values:
            del counts[key]


def _costs_differ(before: NodeView, after: NodeView) -> bool:
    """Whether the planner would price ``after`` differently from ``before``: its queue, or
    whether it has room (free sessions only count as none or some)."""
    return before.queue_depth != after.queue_depth or (before.free_sessions > 0) != (after.free_sessions > 0)


def _cost_may_fall(before: NodeView, after: NodeView) -> bool:
    """Whether the planner may price ``after`` lower than ``before``: a shorter queue, or room
    where there was none (the claimed rate is the record's, which a heartbeat does not change)."""
    return after.queue_depth < before.queue_depth or (before.free_sessions <= 0 < after.free_sessions)


def _rows_differ(before: Mapping[str, float], after: Mapping[str, float], tolerance_ms: float) -> bool:
    """Whether two reports of round trips differ by a peer, or by more than ``tolerance_ms``
    one way (half the round trip) on some peer."""
    if before.keys() != after.keys():
        return True
    return any(abs(after[address] - rtt_ms) / 2.0 > tolerance_ms for address, rtt_ms in before.items())
