"""A session lives no longer than its route's ticket: once the ticket expired (past the clock
skew shards allow), the shard's sweep releases the route's sessions on every shard, whatever
steps still arrive. Real shards on fake engines (``worker_shards``), wired in process."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from manual_clock import ManualClock
from worker_shards import decode, opening, start_route

from meshnet.core.errors import CacheMiss
from meshnet.core.tickets import CLOCK_SKEW_S
from meshnet.node.shard import AnyShard

THREE = ((0, 2), (2, 4), (4, 6))
PROMPT = (3, 1, 4, 1, 5)
LIFE_S = 120.0


async def sweep(shards: Sequence[AnyShard]) -> int:
    """One pass of every shard's sweep, as each worker's runs on its own."""
    return sum([await shard.expire_idle() for shard in shards])


async def test_a_routes_sessions_are_released_on_every_shard_when_its_ticket_expires() -> None:
    wall = ManualClock()
    wall.now = 1_800_000_000.0
    route = await start_route(THREE, wall_clock=wall)
    try:
        first = opening(route, "s-ticket", PROMPT, ticket_seconds=LIFE_S)
        opened = await route.head.handle(first, None)
        assert [shard.open_sessions for shard in route.shards] == [1, 1, 1]
        position, token = opened.next_position, opened.token_id
        wall.now += LIFE_S + CLOCK_SKEW_S - 1  # steps keep coming until the ticket is out
        assert token is not None
        stepped = await route.head.handle(decode(first, step=1, position=position, token=token), None)
        assert await sweep(route.shards) == 0 and stepped.token_id is not None
        wall.now += 2
        assert await sweep(route.shards) >= 1
        assert [shard.open_sessions for shard in route.shards] == [0, 0, 0]
        assert await sweep(route.shards) == 0  # what ended is not asked about again
        with pytest.raises(CacheMiss, match="ticket expired"):
            await route.head.handle(decode(first, step=2, position=stepped.next_position, token=1), None)
    finally:
        await route.close()
