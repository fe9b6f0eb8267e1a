"""A channel replaced by a certificate renewal (``membership.channel.RenewingChannel``) closes
once its calls ended, with the relay forwarder it holds, instead of living until ``close``."""

from __future__ import annotations

import asyncio
import socket
import time

from meshnet.membership.channel import RenewingChannel
from meshnet.relay.dial import RelayedChannel
from meshnet.security.certificates import create_authority, mint_node
from meshnet.wire.tls import LinkSecurity, hop_server_name


def listening(address: str) -> bool:
    """Whether a forwarder's socket (``127.0.0.1:PORT``, or ``unix:PATH``) still accepts."""
    if address.startswith("unix:"):
        with socket.socket(socket.AF_UNIX) as probe:
            return probe.connect_ex(address.removeprefix("unix:").removeprefix("//")) == 0
    host, _, port = address.rpartition(":")
    with socket.socket() as probe:
        return probe.connect_ex((host, int(port))) == 0


async def test_a_renewal_retires_the_old_relayed_channel_and_its_forwarder() -> None:
    now = time.time()
    authority = create_authority("test", now)
    security = LinkSecurity(mint_node(authority, node_id="gw-1", role="gateway", now_unix_s=now))
    renewing = RenewingChannel("w-home@127.0.0.1:7401", security, hop_server_name("w-home"))
    try:
        old = renewing.channel()
        assert isinstance(old, RelayedChannel)
        await asyncio.sleep(0.05)  # the forwarder starts serving on the loop
        assert listening(old.forwarder.address)
        security.replace_node(mint_node(authority, node_id="gw-1", role="gateway", now_unix_s=now))
        new = renewing.channel()
        assert isinstance(new, RelayedChannel) and new is not old
        await asyncio.sleep(0.05)
        for _ in range(50):  # no call in flight on the old one: it closes at once
            if not listening(old.forwarder.address):
                break
            await asyncio.sleep(0.02)
        assert not listening(old.forwarder.address) and listening(new.forwarder.address)
    finally:
        await renewing.close()
    assert not listening(new.forwarder.address)
