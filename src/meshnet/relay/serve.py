"""A relay process's server: the Relay service on one mTLS port."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import grpc.aio

from meshnet.core.addresses import dialable_address
from meshnet.relay.config import RelayConfig
from meshnet.relay.server import RelayServicer
from meshnet.wire import relay_wire
from meshnet.wire.tls import LinkSecurity, bind, link_options

SPARE_RPCS = 64


@dataclass(frozen=True)
class RunningRelay:
    address: str
    """Where nodes and dialers reach it (the advertised address)."""
    port: int
    server: grpc.aio.Server
    servicer: RelayServicer

    async def stop(self, grace: float | None = None) -> None:
        await self.server.stop(grace)


async def start_relay(
    config: RelayConfig, security: LinkSecurity | None, *, on_crossing: Callable[[float], None] | None = None
) -> RunningRelay:
    """Bind and start serving; call inside the event loop that will run it (``on_crossing``:
    ``RelayServicer``'s timing hook, for the crossing benchmark)."""
    bounds = config.bounds
    server = grpc.aio.server(
        # A relay's messages are chunks (and small headers and events): a bigger one is refused
        # by grpc before the relay holds it (a frame-sized message per stream would be memory).
        options=link_options(relay_wire.CHUNK_BYTES + relay_wire.MAX_HEADER_BYTES),
        # Every handler is a task: bound them by what the bounds admit (an Attach and two
        # streams a connection per node), plus room for Load and for refusals.
        maximum_concurrent_rpcs=bounds.max_nodes * (1 + 2 * bounds.max_connections_per_node) + SPARE_RPCS,
    )
    port = bind(server, config.listen, security)
    host = config.listen.rpartition(":")[0]
    advertise = config.advertise or dialable_address(f"{host}:{port}")
    if config.capture_dir is not None:
        config.capture_dir.mkdir(parents=True, exist_ok=True)
    servicer = RelayServicer(security, advertise, bounds, capture_dir=config.capture_dir, on_crossing=on_crossing)
    server.add_generic_rpc_handlers((servicer.handler(),))
    await server.start()
    return RunningRelay(advertise, port, server, servicer)
