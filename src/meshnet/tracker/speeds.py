"""What routes measured: gateways' timings of real requests, and the node times they imply.

Every request a gateway serves is work on a route the tracker chose, timed end to end by the
party that drove it (``core.tracking.RouteTiming``). A node cannot make its route look faster
than it was: the time between two tokens passes through every hop, whatever the hops say.

Estimator. The tracker knows sums (a route's time) and wants terms (each hop's time). With
routes that share hops, the sums identify differences (two heads before the same tail differ
by exactly what their routes differ by), never a full split: a head and a tail seen only
together can split their sum any way. ``fit_hop_ms`` therefore solves the routes' equations
by least squares for the change from a starting split of smallest norm: the solution *nearest
to that start* (numpy's ``lstsq`` gives the minimum-norm change; nodes it would drive below
``MIN_HOP_MS`` are held there and the rest solved again). The caller (``tracker.claims``)
starts each node at its layers' share of the fastest route it served on, so what the
measurements leave open is split by layers and by the best each node has shown, never by what
nodes claim, and any split that fits gives every measured route exactly its measured time,
which is what the planner compares. Splitting a route's time in proportion to the hops' claims (the obvious alternative)
was rejected: a boaster's tiny claimed time would get a tiny share of its own slowness, and its
honest neighbour the rest. Each route keeps the median of its last few timings, robust to one
stalled request, and forgets a route not timed for ``horizon_s``, so a node changes its measure
only by serving (a node no route reaches any more is measured again after that: one route).

Everything here but ``RouteMeasurements`` (the tracker's record, one event loop) is a pure
function of its arguments.
"""

from __future__ import annotations

import itertools
import statistics
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from meshnet.core.ids import NodeId
from meshnet.core.node_record import NodeRecord
from meshnet.core.tracking import RouteTiming

SAMPLES_PER_ROUTE = 5
"""Timings a route keeps; their median is its measure."""
MIN_HOP_MS = 0.001
"""No hop is believed faster than this, whatever the fit says (a fit may drive a term to 0)."""


@dataclass(frozen=True)
class RouteMeasure:
    """One route's measured decode time per token (the median of its recent timings)."""

    hops: tuple[NodeId, ...]
    ms_per_token: float


class RouteMeasurements:
    """Recent timings by route, for the registry. Call from one event loop only."""

    def __init__(self, *, horizon_s: float = 600.0, max_routes: int = 256) -> None:
        self._horizon_s = horizon_s
        self._max_routes = max_routes
        self._routes: OrderedDict[tuple[NodeId, ...], tuple[deque[float], float]] = OrderedDict()
        self.version = 0
        """Moves with every change of what ``recent`` would return but for expiry."""

    def observe(self, timing: RouteTiming, now: float) -> None:
        last = next(reversed(self._routes), None)
        samples, _ = self._routes.pop(timing.hops, (deque(maxlen=SAMPLES_PER_ROUTE), now))
        before = statistics.median(samples) if samples else None
        samples.append(timing.decode_ms_per_token)
        self._routes[timing.hops] = (samples, now)
        while len(self._routes) > self._max_routes:
            self._routes.popitem(last=False)
        # The same route timed again, still last and at the same median: ``recent`` returns what
        # it did, so the beliefs fitted from it (``RouteIndex.refresh``) stand.
        if last != timing.hops or before != statistics.median(samples):
            self.version += 1

    def recent(self, now: float) -> tuple[RouteMeasure, ...]:
        """The routes timed within the horizon, each with the median of its recent timings."""
        stale = [hops for hops, (_, at) in self._routes.items() if now - at >= self._horizon_s]
        for hops in stale:
            del self._routes[hops]
        if stale:
            self.version += 1
        return tuple(RouteMeasure(hops, statistics.median(samples)) for hops, (samples, _) in self._routes.items())


def fit_hop_ms(prior_ms: Mapping[NodeId, float], routes: Sequence[RouteMeasure]) -> dict[NodeId, float]:
    """Each node's time per token: the split of the routes' times nearest to ``prior_ms``.

    ``routes`` give each route's time spent in its hops (seams already taken out); a route
    naming a node absent from ``prior_ms`` is skipped (the node left: its share is unknown).
    Nodes on no usable route keep their prior. No hop's time falls below ``MIN_HOP_MS`` or
    exceeds its fastest route's whole time: a hop cannot take longer than the route through it.
    """
    usable = [route for route in routes if all(hop in prior_ms for hop in route.hops)]
    estimate = dict(prior_ms)
    if not usable:
        return estimate
    nodes = sorted({hop for route in usable for hop in route.hops})
    column = {node_id: index for index, node_id in enumerate(nodes)}
    incidence = np.zeros((len(usable), len(nodes)))
    for row, route in enumerate(usable):
        incidence[row, [column[hop] for hop in route.hops]] = 1.0
    start = np.array([prior_ms[node_id] for node_id in nodes])
    measured = np.array([route.ms_per_token for route in usable])
    fitted = _nearest_fit(incidence, measured, start)
    ceiling: dict[NodeId, float] = {}
    for route in usable:
        for hop in route.hops:
            ceiling[hop] = min(ceiling.get(hop, route.ms_per_token), route.ms_per_token)
    for node_id, value in zip(nodes, fitted, strict=True):
        estimate[node_id] = min(max(float(value), MIN_HOP_MS), max(ceiling[node_id], MIN_HOP_MS))
    return estimate


def _nearest_fit(incidence: np.ndarray, measured: np.ndarray, start: np.ndarray) -> np.ndarray:
    """The times nearest to ``start`` whose route sums fit ``measured`` best, none below
    ``MIN_HOP_MS``: the least-squares change of smallest norm (exact when the routes agree),
    with any node it would drive below the floor held at the floor and the rest solved again."""
    values = start.astype(float)
    free = np.ones(len(start), dtype=bool)
    for _ in range(len(start)):
        fixed_sum = incidence[:, ~free] @ values[~free]
        rest = measured - fixed_sum - incidence[:, free] @ start[free]
        values[free] = start[free] + np.linalg.lstsq(incidence[:, free], rest, rcond=None)[0]
        low = free & (values < MIN_HOP_MS)
        if not low.any():
            break
        values[low] = MIN_HOP_MS
        free &= ~low
    return values


def measured_nodes(routes: Sequence[RouteMeasure], live: Mapping[NodeId, object]) -> frozenset[NodeId]:
    """The live nodes some route of live nodes measured."""
    return frozenset(hop for route in routes if all(h in live for h in route.hops) for hop in route.hops)


def forms_route(records: Sequence[NodeRecord]) -> bool:
    """The nodes form a whole route of one recipe: layer 0 to the last, each meeting the next
    (only such a timing measures anything)."""
    first, last = records[0], records[-1]
    meet = all(a.layers.stop == b.layers.start for a, b in itertools.pairwise(records))
    same = all(record.fingerprint == first.fingerprint for record in records)
    return meet and same and first.layers.start == 0 and last.layers.stop == last.n_layers
