"""relay.dial: a direct address is the channel it always was; a relayed one owns a forwarder."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import grpc.aio
import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.relay.dial import RelayedChannel, dial
from meshnet.security.identity import ANY_WORKER_NAME


async def test_a_direct_address_gets_a_plain_channel() -> None:
    channel = dial("127.0.0.1:7000", None, ANY_WORKER_NAME, [])
    assert isinstance(channel, grpc.aio.Channel) and not isinstance(channel, RelayedChannel)
    await channel.close()


async def test_a_relayed_address_gets_a_forwarder_only_this_user_reaches_removed_with_the_channel() -> None:
    channel = dial("w-abc123@127.0.0.1:9", None, ANY_WORKER_NAME, [])
    assert isinstance(channel, RelayedChannel)
    # A Unix socket in a 0700 folder, not a loopback port any local process could dial.
    scheme, _, path = channel.forwarder.address.partition(":")
    assert scheme == "unix" and Path(path).parent == channel.forwarder.folder
    assert stat.S_IMODE(channel.forwarder.folder.stat().st_mode) == 0o700
    _, writer = await asyncio.open_unix_connection(path)  # it listens from the start
    writer.close()
    await channel.close()
    assert not channel.forwarder.folder.exists()
    with pytest.raises(OSError):
        await asyncio.open_unix_connection(path)


def test_a_malformed_relayed_address_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="NODE_ID@RELAY_HOST:PORT"):
        dial("not a node@127.0.0.1:7090", None, ANY_WORKER_NAME, [])
