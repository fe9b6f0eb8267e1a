"""Unary calls to a shard: capability, metrics, release, cancel. Each has a short deadline."""

from __future__ import annotations

import grpc

from meshnet.client.shard_stream import ChannelPool
from meshnet.core.ids import SessionId
from meshnet.protocol.convert import (
    SessionEnd,
    cancel_to_proto,
    capability_from_proto,
    metrics_from_proto,
)
from meshnet.protocol.frames import CapabilityInfo
from meshnet.protocol.generated import shard_pb2 as pb
from meshnet.protocol.status import error_from_rpc

ADMIN_TIMEOUT_S = 2.0


async def fetch_capability(pool: ChannelPool, address: str, timeout_s: float = ADMIN_TIMEOUT_S) -> CapabilityInfo:
    try:
        message = await pool.stub(address).GetCapability(pb.CapabilityRequest(), timeout=timeout_s)
    except grpc.RpcError as error:
        raise error_from_rpc(error) from None
    return capability_from_proto(message)


async def fetch_metrics(pool: ChannelPool, address: str, timeout_s: float = ADMIN_TIMEOUT_S) -> dict[str, float]:
    try:
        message = await pool.stub(address).GetMetrics(pb.MetricsRequest(), timeout=timeout_s)
    except grpc.RpcError as error:
        raise error_from_rpc(error) from None
    return metrics_from_proto(message)


async def cancel_session(pool: ChannelPool, address: str, session_id: SessionId, reason: str) -> bool:
    try:
        reply = await pool.stub(address).Cancel(
            cancel_to_proto(SessionEnd(session_id, reason)), timeout=ADMIN_TIMEOUT_S
        )
    except grpc.RpcError as error:
        raise error_from_rpc(error) from None
    return bool(reply.freed)
