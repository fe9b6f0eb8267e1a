"""relay.dial: a direct address is the channel it always was; a relayed one owns a forwarder."""

from __future__ import annotations

import asyncio

import grpc.aio
import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.relay.dial import RelayedChannel, dial
from meshnet.wire.tls import ANY_WORKER_NAME


async def test_a_direct_address_gets_a_plain_channel() -> None:
    channel = dial("127.0.0.1:7000", None, ANY_WORKER_NAME, [])
    assert isinstance(channel, grpc.aio.Channel) and not isinstance(channel, RelayedChannel)
    await channel.close()


async def test_a_relayed_address_gets_a_forwarder_on_loopback_closed_with_the_channel() -> None:
    channel = dial("w-abc123@127.0.0.1:9", None, ANY_WORKER_NAME, [])
    assert isinstance(channel, RelayedChannel)
    host, _, port = channel.forwarder.address.rpartition(":")
    assert host == "127.0.0.1"
    _, writer = await asyncio.open_connection(host, int(port))  # it listens from the start
    writer.close()
    await channel.close()
    with pytest.raises(OSError):
        await asyncio.open_connection(host, int(port))


def test_a_malformed_relayed_address_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="NODE_ID@RELAY_HOST:PORT"):
        dial("not a node@127.0.0.1:7090", None, ANY_WORKER_NAME, [])
