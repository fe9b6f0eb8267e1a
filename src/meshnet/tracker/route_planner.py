"""How a route is planned for a query that keeps no sticky route: the conversation's earlier
route while it holds and has room, else the planner's over the route index (cached per model
while nothing it prices moved), preferring a head that holds a prefix of the prompt.

The registry decides *whether* a session needs a new route (stickiness, the epoch, counting
what was routed); this module decides *which* one, reading the index, the routes' measured
speeds and the conversations' routes the registry owns.
"""

from __future__ import annotations

from collections.abc import Callable

from meshnet.core.ids import NodeId
from meshnet.core.tracking import NodeLoad, Route, RouteQuery
from meshnet.tracker.affinity import ConversationRoutes, PrefixRouting, plan_of, prefer_held_prefix
from meshnet.tracker.node_entry import Clock
from meshnet.tracker.route_costs import LatencyTable, NodeView, RoutingCosts
from meshnet.tracker.route_index import RouteIndex
from meshnet.tracker.routing import RoutePlan, choose_model_route
from meshnet.tracker.speeds import RouteMeasurements


class RoutePlanner:
    """Plans fresh routes from the registry's index, measurements and conversations (shared,
    not copied: the registry keeps them up to date). One event loop, like the registry."""

    def __init__(
        self,
        *,
        index: RouteIndex,
        measured: RouteMeasurements,
        conversations: ConversationRoutes,
        costs: RoutingCosts,
        mixed_devices: bool,
        clock: Clock,
        load_of: Callable[[NodeId], NodeLoad | None],
    ) -> None:
        self._index = index
        self._measured = measured
        self._conversations = conversations
        self._costs = costs
        self._mixed_devices = mixed_devices
        self._clock = clock
        self._load_of = load_of

    def plan(self, query: RouteQuery, given_latency_ms: LatencyTable | None) -> RoutePlan:
        """The route the request's conversation was given, while it holds and has room; else the
        planner's (cached per model while nothing it prices moved: ``route_index.PlanCache``),
        or one whose head holds a prefix of the prompt (``tracker.affinity``)."""
        latency_ms = self._index.latency if given_latency_ms is None else given_latency_ms
        routes, version = self._measured.recent(self._clock()), self._measured.version
        self._index.refresh(routes, version)  # beliefs that moved forget the cached plans first
        names, chain = self._index.model_names(query.model), query.prefix_chain
        cacheable = not query.exclude and given_latency_ms is None and len(names) == 1

        def plan(views: tuple[NodeView, ...]) -> RoutePlan:
            return choose_model_route(
                views,
                query.model,
                latency_ms=latency_ms,
                exclude=query.exclude,
                costs=self._costs,
                mixed_devices=self._mixed_devices,
            )

        if cacheable and not chain:  # a cache hit reads no node at all
            return self._index.plan(
                names[0], query.model, self._mixed_devices, lambda: plan(self._index.views_of(query.model))
            )
        views = self._index.views_of(query.model)
        known = self._conversations.recall(chain, self._clock()) if chain else None
        if known is not None:
            kept = plan_of(known, views, query.model, latency_ms=latency_ms, exclude=query.exclude, costs=self._costs)
            if kept is not None:
                return kept
        base = (
            self._index.plan(names[0], query.model, self._mixed_devices, lambda: plan(views))
            if cacheable
            else plan(views)
        )
        if not chain:
            return base
        # Tips live in each node's last load report: memory only, gone with the node.
        tips = {view.node_id: dict(load.prefix_tips) for view in views if (load := self._load_of(view.node_id))}
        prefix = PrefixRouting(chain, tips)
        return prefer_held_prefix(base, views, prefix, latency_ms=latency_ms, exclude=query.exclude, costs=self._costs)


def serves(route: Route, model: str) -> bool:
    """Whether ``route`` is one of ``model`` (asked by name or by recipe fingerprint)."""
    return model in (route.model, route.fingerprint)


def route_of(plan: RoutePlan, epoch: int) -> Route:
    """The route handed out for ``plan`` at ``epoch``."""
    return Route(
        hops=plan.hops,
        epoch=epoch,
        model=plan.model,
        quantization=plan.quantization,
        fingerprint=plan.fingerprint,
        n_layers=plan.n_layers,
        ms_per_token=plan.ms_per_token,
    )
