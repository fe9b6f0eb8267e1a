"""The shard channel pool (``route.shard_stream.ChannelPool``) lets go of a relayed node's old
addresses: each holds a forwarder (a listening socket and a channel to a relay), so a node that
moved from relay to relay must not leave one behind per move."""

from __future__ import annotations

import asyncio
import socket

from meshnet.relay.dial import RelayedChannel
from meshnet.route.shard_stream import ChannelPool


def listening(address: str) -> bool:
    """Whether a forwarder's socket (``127.0.0.1:PORT``, or ``unix:PATH``) still accepts."""
    if address.startswith("unix:"):
        with socket.socket(socket.AF_UNIX) as probe:
            probe.settimeout(0.5)
            return probe.connect_ex(address.removeprefix("unix:").removeprefix("//")) == 0
    host, _, port = address.rpartition(":")
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((host, int(port))) == 0


async def forwarder_of(pool: ChannelPool, address: str) -> str:
    channel = pool.channel(address)
    if not isinstance(channel, RelayedChannel):
        raise TypeError(f"{address} is not dialled through a relay")
    await asyncio.sleep(0.05)  # the forwarder starts serving on the loop
    return channel.forwarder.address


async def _gone(address: str) -> bool:
    for _ in range(50):
        if not listening(address):
            return True
        await asyncio.sleep(0.02)
    return False


async def test_a_node_asked_at_another_relay_leaves_its_old_channel_closed() -> None:
    pool = ChannelPool(1 << 20)
    try:
        first = await forwarder_of(pool, "w-home@127.0.0.1:7401")
        other = await forwarder_of(pool, "w-away@127.0.0.1:7401")  # another node at that relay
        pool.channel("127.0.0.1:7000")  # a direct peer
        assert listening(first) and listening(other)
        second = await forwarder_of(pool, "w-home@127.0.0.1:7402")  # w-home moved
        assert await _gone(first), "the old relay's forwarder still listens"
        assert listening(second) and listening(other)
        assert pool.addresses == {"w-home@127.0.0.1:7402", "w-away@127.0.0.1:7401", "127.0.0.1:7000"}
        # A stale route naming the old relay gets a channel there, and w-home's newest one retires.
        again = await forwarder_of(pool, "w-home@127.0.0.1:7401")
        assert await _gone(second) and listening(again)
        assert pool.addresses == {"w-home@127.0.0.1:7401", "w-away@127.0.0.1:7401", "127.0.0.1:7000"}
    finally:
        await pool.close()
    assert not listening(again) and not listening(other)
