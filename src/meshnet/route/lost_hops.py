"""Which lost hops a failover avoids: a hop is a node at an address, and a relayed node lost
with its relay comes back at another one.

A hop found dead stays excluded for the rest of the request (the tracker lists it until it
misses enough heartbeats, and routing onto it again wastes a failover). The tracker is asked
first with every lost hop excluded: a replica of a lost relayed node is taken at once. Only when
that leaves no route is a node behind NAT (``NODE@RELAY``, lost whenever its relay is) waited
for: it re-attaches to its next relay and registers there within about a second
(``membership.reach``; in between it is registered private, at no relay), so the tracker is
asked again every ``poll_s``, with that node allowed at any other address, until ``wait_s``
passed. A node with no relay left then ends the request with the usual typed error.

"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping

from meshnet.core.addresses import is_relayed
from meshnet.core.errors import NoRoute
from meshnet.core.ids import NodeId
from meshnet.core.tracking import Route

RELAY_MOVE_WAIT_S = 2.0
"""How long a failover with no other route waits for a relayed hop to register at another
relay. The node and the route lose the relay together (at once when it closes, or by the same
~2.5 s keepalive when it goes silent), and the node's attach and registration take milliseconds
to a second; the issue wants a typed error within 5 s when no relay is left, and a silent loss
already spends ~2.5 s of it before the failover starts."""
RELAY_MOVE_POLL_S = 0.25
"""Between two lenient asks: each is a full ChooseRoute, so at most ~8 of them per failover."""

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

    Raises the strict ask's ``NoRoute`` when no lost relayed node came back within ``wait_s``."""
    strict = excluded(lost_at, relayed_too=True)
    lenient = excluded(lost_at, relayed_too=False)
    try:
        return await ask(strict)
    except NoRoute:
        if lenient == strict:
            raise
        deadline = clock() + wait_s
        while clock() + poll_s <= deadline:
            await asyncio.sleep(poll_s)
            with contextlib.suppress(NoRoute):  # moving: registered private between two relays
                route = await ask(lenient)
                if not revisits_a_lost_hop(route, lost_at):
                    return route
        raise
