"""Which lost hops a failover avoids: a hop is a node at an address, and a relayed node lost
with its relay comes back at another one.

A hop found dead stays excluded for the rest of the request (the tracker lists it until it
misses enough heartbeats, and routing onto it again wastes a failover). But a node behind NAT
(``NODE@RELAY``) is lost whenever its relay is, and it re-attaches to its next relay and
registers there within about a second (``membership.reach``; in between it is registered
private, at no relay). So a relayed hop is avoided only at the address it was lost at: the
replacement route may take the node again once it registered elsewhere, and the tracker is
asked again (briefly) while it lists the node at the dead relay or at none. Once ``wait_s``
passed the node is excluded like any lost hop, so a node with no relay left ends the request
with the usual typed error (after the wait).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

from meshnet.core.addresses import is_relayed
from meshnet.core.errors import NoRoute
from meshnet.core.ids import NodeId
from meshnet.core.tracking import Route

RELAY_MOVE_WAIT_S = 3.0
"""How long a failover waits for a relayed hop to register at another relay: the node notices
a dead relay at once (or by keepalive within ~2.5 s), attaches to the next and registers."""
RELAY_MOVE_POLL_S = 0.1

LostAt = Mapping[NodeId, str]
"""Each hop found dead during a request: the address it was lost at."""


def excluded(lost_at: LostAt, *, relayed_too: bool) -> frozenset[NodeId]:
    """The node ids to exclude: every lost one, or (not ``relayed_too``) those lost at a direct
    address, since a relayed one may be back at another relay."""
    return frozenset(node for node, address in lost_at.items() if relayed_too or not is_relayed(address))


def revisits_a_lost_hop(route: Route, lost_at: LostAt) -> bool:
    """True when ``route`` takes a node at the very address it was lost at."""
    return any(lost_at.get(hop.node_id) == hop.address for hop in route.hops)


async def replacement_route(
    ask: Callable[[frozenset[NodeId]], Awaitable[Route]],
    lost_at: LostAt,
    *,
    wait_s: float = RELAY_MOVE_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
    poll_s: float = RELAY_MOVE_POLL_S,
) -> Route:
    """A route avoiding every lost hop, from ``ask(excluded node ids)`` (the tracker's ChooseRoute).

    Raises what ``ask`` raises (``NoRoute``) when even the strict exclusion leaves no route."""
    strict = excluded(lost_at, relayed_too=True)
    lenient = excluded(lost_at, relayed_too=False)
    if lenient == strict:
        return await ask(strict)
    deadline = clock() + wait_s
    while clock() < deadline:
        try:
            route = await ask(lenient)
        except NoRoute:
            pass  # moving: registered private between two relays
        else:
            if not revisits_a_lost_hop(route, lost_at):
                return route
        await asyncio.sleep(poll_s)
    return await ask(strict)
