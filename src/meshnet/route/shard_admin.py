"""Unary calls to a shard: capability and metrics. Each has a short deadline."""

from __future__ import annotations

import grpc

from meshnet.route.shard_stream import ChannelPool
from meshnet.wire.frames import CapabilityInfo
from meshnet.wire.shard_wire import (
    capability_from_proto,
    capability_request_to_proto,
    metrics_from_proto,
    metrics_request_to_proto,
)
from meshnet.wire.status import error_from_rpc

ADMIN_TIMEOUT_S = 2.0


async def fetch_capability(
    pool: ChannelPool, address: str, timeout_s: float = ADMIN_TIMEOUT_S, node_id: str | None = None
) -> CapabilityInfo:
    try:
        message = await pool.stub(address, node_id).GetCapability(capability_request_to_proto(), timeout=timeout_s)
    except grpc.RpcError as error:
        raise error_from_rpc(error) from None
    return capability_from_proto(message)


async def fetch_metrics(pool: ChannelPool, address: str, timeout_s: float = ADMIN_TIMEOUT_S) -> dict[str, float]:
    try:
        message = await pool.stub(address).GetMetrics(metrics_request_to_proto(), timeout=timeout_s)
    except grpc.RpcError as error:
        raise error_from_rpc(error) from None
    return metrics_from_proto(message)
