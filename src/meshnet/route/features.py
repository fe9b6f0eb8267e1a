"""Route a request only through a tail that serves what it needs (``core.features``).

The tracker chooses routes without knowing what a request needs, so the route client checks
the tail of each route it is given against the request's needed features; a tail that lacks
one is excluded and the tracker asked again, so an old tail in a mixed-version swarm is passed
over as long as a capable one covers the last layers. When none does, the request is refused
with ``FeatureUnavailable`` naming the features, rather than served by a tail that would ignore
them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from meshnet.core.errors import FeatureUnavailable, NoRoute
from meshnet.core.ids import NodeId
from meshnet.core.tracking import Route

MAX_TAILS_PASSED = 16
"""Old tails passed over for one request before it is refused (bounds the tracker calls)."""

Ask = Callable[[frozenset[NodeId]], Awaitable[Route]]
"""The tracker's route for a request, avoiding the given nodes."""


def missing_features(route: Route, needed: frozenset[str]) -> frozenset[str]:
    """What ``route``'s tail does not serve of ``needed`` (empty: the route serves the request)."""
    return needed.difference(route.hops[-1].capability.features)


async def capable_route(ask: Ask, needed: frozenset[str], exclude: frozenset[NodeId] = frozenset()) -> Route:
    """A route from ``ask`` (avoiding ``exclude``) whose tail serves every feature in ``needed``."""
    passed: set[NodeId] = set()
    lacking: set[str] = set()
    while True:
        try:
            route = await ask(exclude | passed)
        except NoRoute as no_route:
            if not passed:
                raise
            raise _refused(lacking, len(passed), no_route.message) from None
        missing = missing_features(route, needed)
        if not missing:
            return route
        passed.add(route.hops[-1].node_id)
        lacking |= missing
        if len(passed) >= MAX_TAILS_PASSED:
            raise _refused(lacking, len(passed), "no other tail was tried")


def _refused(lacking: set[str], passed: int, why: str) -> FeatureUnavailable:
    return FeatureUnavailable(
        f"this request needs {', '.join(sorted(lacking))}, which the {passed} tail(s) of this swarm that "
        f"could serve it do not (they run an older meshnet), and no other route has a tail that does "
        f"({why}); upgrade the nodes that run the model's last layers, or send the request without it"
    )
