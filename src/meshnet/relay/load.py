"""Asking a relay for its load: attached nodes, open connections, bytes each way, refusals."""

from __future__ import annotations

import grpc

from meshnet.relay.dial import relay_channel
from meshnet.wire import relay_wire
from meshnet.wire.status import error_from_rpc
from meshnet.wire.tls import LinkSecurity

LOAD_TIMEOUT_S = 5.0


async def fetch_load(
    relay: str, security: LinkSecurity | None, *, timeout_s: float = LOAD_TIMEOUT_S
) -> relay_wire.RelayLoadFigures:
    """The relay's ``Load`` (any swarm member may ask); its typed error otherwise."""
    async with relay_channel(relay, security) as channel:
        try:
            reply = await relay_wire.load_call(channel)(relay_wire.load_request(), timeout=timeout_s)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
    return relay_wire.load_from_proto(reply)
