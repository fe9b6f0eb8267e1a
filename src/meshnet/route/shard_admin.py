"""Unary calls to a shard outside any request: liveness, capability and metrics. Each has a short
deadline.

Nothing here runs on a request's path. Routes carry each hop's capability (``RouteHop``), so a
request never asks GetCapability; liveness is the standard ``grpc.health.v1`` check every worker
serves, the cheapest call there is. ``describe_hop`` asks GetCapability once, for routes built
without a tracker (the bench, tests).
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meshnet.core.events import RouteHop
from meshnet.core.ids import NodeId
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire import services
from meshnet.wire.frames import CapabilityInfo
from meshnet.wire.shard_wire import (
    capability_from_proto,
    capability_request_to_proto,
    metrics_from_proto,
    metrics_request_to_proto,
)
from meshnet.wire.status import error_from_rpc

ADMIN_TIMEOUT_S = 2.0


async def is_serving(
    pool: ChannelPool, address: str, timeout_s: float = ADMIN_TIMEOUT_S, node_id: str | None = None
) -> bool:
    """Whether the shard at ``address`` answers its health check SERVING within ``timeout_s``.

    False for one that cannot be reached, fails the handshake (another node at that address,
    when ``node_id`` pins one) or is draining for shutdown (it takes no new session)."""
    stub = health_pb2_grpc.HealthStub(pool.channel(address, node_id))
    request = health_pb2.HealthCheckRequest(service=services.SHARD_SERVICE)
    try:
        reply = await stub.Check(request, timeout=timeout_s)
    except grpc.RpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


async def fetch_capability(
    pool: ChannelPool, address: str, timeout_s: float = ADMIN_TIMEOUT_S, node_id: str | None = None
) -> CapabilityInfo:
    try:
        message = await pool.stub(address, node_id).GetCapability(capability_request_to_proto(), timeout=timeout_s)
    except grpc.RpcError as error:
        raise error_from_rpc(error) from None
    return capability_from_proto(message)


async def describe_hop(
    pool: ChannelPool, address: str, node_id: str | None = None, timeout_s: float = ADMIN_TIMEOUT_S
) -> RouteHop:
    """The node at ``address`` as a route hop, from the record it describes itself with."""
    info = await fetch_capability(pool, address, timeout_s, node_id)
    return RouteHop(NodeId(info.node_id), address, info.record.layers, info.record.capability)


async def fetch_metrics(pool: ChannelPool, address: str, timeout_s: float = ADMIN_TIMEOUT_S) -> dict[str, float]:
    try:
        message = await pool.stub(address).GetMetrics(metrics_request_to_proto(), timeout=timeout_s)
    except grpc.RpcError as error:
        raise error_from_rpc(error) from None
    return metrics_from_proto(message)
