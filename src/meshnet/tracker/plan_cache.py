"""The tracker's cached route plans, per model, and what each change does to them.

Kept by the route index (``tracker.route_index``), which tells it which node changed and how;
the plans themselves come from the pure planner (``tracker.routing``). Call from one event loop.
"""

from __future__ import annotations

from collections.abc import Callable

from meshnet.core.ids import NodeId
from meshnet.tracker.routing import RoutePlan


class PlanCache:
    """Plans by model name, for requests with no exclusion and no prompt prefix.

    What each change does to a model's plans (the planner prices a node's queue, its room, its
    believed rate, its seams, and nothing else):

    * a node **on** a kept plan changes any of those, or leaves: the model's plans are forgotten;
    * a node **off** every plan gets costlier, or leaves: the plans are kept, and stay exactly the
      planner's choice, since every other chain only got dearer (ties break the same way);
    * a node off the plans may have got cheaper (room again, a shorter queue, a faster belief, a
      seam re-measured) or a node joins: the plans are kept for at most
      ``improvement_staleness_s`` after the first such change, then made again. Without this a
      busy swarm replans on nearly every route (each heartbeat of a node that filled up gives it
      room again); with it a model is replanned at most once per window for improvements, and a
      plan is never used after one of its own nodes filled up or slowed. 0 replans at once.

    Seam round trips have a tolerance: a report that moves every one-way latency by at most
    ``latency_tolerance_ms`` (and names the same peers) from what the plan was made with counts
    as no change, so a cached plan may price a seam up to that far from the latest heartbeat, and
    cost up to ``2 * latency_tolerance_ms`` per seam (of it and of the best route) more than the
    plan the latest numbers would choose. Anything beyond is a change as above.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        latency_tolerance_ms: float = 1.0,
        improvement_staleness_s: float = 0.0,
    ) -> None:
        self.latency_tolerance_ms = latency_tolerance_ms
        self.improvement_staleness_s = improvement_staleness_s
        self._clock = clock
        self._plans: dict[str, dict[tuple[str, bool], RoutePlan]] = {}
        self._on_plans: dict[str, set[NodeId]] = {}
        """The nodes on each model's kept plans."""
        self._improved_at: dict[str, float] = {}
        """When a node off a model's kept plans first may have got cheaper since they were made."""
        self.hits = 0
        self.misses = 0

    def plan(self, name: str, asked: str, mixed: bool, planner: Callable[[], RoutePlan]) -> RoutePlan:
        """The cached plan of ``asked`` (served under the model name ``name``), else the
        planner's, kept. A refusal (``NoRoute``) is never kept: it is cheap and rare."""
        improved_at = self._improved_at.get(name)
        if improved_at is not None and self._clock() - improved_at >= self.improvement_staleness_s:
            self.forget(name)
        plans = self._plans.setdefault(name, {})
        found = plans.get((asked, mixed))
        if found is not None:
            self.hits += 1
            return found
        self.misses += 1
        plan = planner()
        plans[(asked, mixed)] = plan
        self._on_plans.setdefault(name, set()).update(hop.node_id for hop in plan.hops)
        return plan

    def holds(self, name: str) -> bool:
        """Whether some plan of the model ``name`` is kept."""
        return bool(self._plans.get(name))

    def uses(self, name: str, node_id: NodeId) -> bool:
        """Whether ``node_id`` is on a kept plan of the model ``name``."""
        return node_id in self._on_plans.get(name, ())

    def improved(self, name: str) -> None:
        """Some node off the model's plans may be cheaper now: replan once the staleness allowed
        for improvements has passed (at once when it is 0)."""
        if not self.holds(name):
            return
        if self.improvement_staleness_s <= 0:
            self.forget(name)
        else:
            self._improved_at.setdefault(name, self._clock())

    def forget(self, name: str) -> None:
        self._plans.pop(name, None)
        self._on_plans.pop(name, None)
        self._improved_at.pop(name, None)

    def forget_all(self) -> None:
        self._plans.clear()
        self._on_plans.clear()
        self._improved_at.clear()
