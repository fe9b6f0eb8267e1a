"""An address a node identity owns: a gRPC server answering health checks under that identity's
certificate, as a worker's own server does. The tracker's dial-back (``tracker.dial_back``)
accepts a registration only at such an address, so tests that register records by hand on a
secured tracker serve one here first.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from meshnet.wire.tls import LinkSecurity, bind


@contextlib.asynccontextmanager
async def answering_node(security: LinkSecurity, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve health under ``security``'s certificate on ``port`` (a free one by default) of
    ``host``; yields ``host:port``."""
    server = grpc.aio.server()
    health = HealthServicer()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = bind(server, f"{host}:{port}", security)
    await server.start()
    try:
        yield f"{host}:{port}"
    finally:
        await server.stop(0)
