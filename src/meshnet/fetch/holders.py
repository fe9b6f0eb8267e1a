"""The client of a holder's Artifacts service: byte ranges, checked chunk by chunk.

A holder is dialled over one ``RenewingChannel`` (``artifact_channel``): mTLS with the swarm
identity when one is given, pinned to the holder's own name when the directory named its node id
(seeders join as workers, so ``ANY_WORKER_NAME`` otherwise), plaintext on loopback. Which holders
hold what is the tracker's directory (``TrackerClient.find_holders``). Every call has a deadline;
failures arrive as typed errors (``wire.status``). A holder's reply is checked chunk by chunk
(order, CRC-32, exact length); the piece hashes are the fetcher's business (``fetch.fetcher``).
"""

from __future__ import annotations

from typing import Any

import grpc

from meshnet.core.errors import Unavailable
from meshnet.membership.channel import RenewingChannel
from meshnet.security.identity import ANY_WORKER_NAME
from meshnet.wire import artifact_wire as wire
from meshnet.wire import services
from meshnet.wire.status import error_from_rpc
from meshnet.wire.tls import LinkSecurity, link_options

CALL_TIMEOUT_S = 10.0


def artifact_channel_options() -> list[tuple[str, Any]]:
    return link_options(wire.MAX_CHUNK_BYTES + (64 << 10))


def artifact_channel(
    address: str, security: LinkSecurity | None = None, server_name: str = ANY_WORKER_NAME
) -> RenewingChannel:
    """A channel to a holder (any worker-role node of the swarm unless ``server_name`` pins one)."""
    return RenewingChannel(address, security, server_name, artifact_channel_options())


async def _stream(channel: RenewingChannel, request: wire.FetchRange, limit: int, timeout: float) -> bytes:
    """The bytes a Fetch streams, in order and CRC-checked, refusing more than ``limit``."""
    parts: list[bytes] = []
    position = request.offset
    try:
        async for chunk in channel.stub(services.ArtifactsStub).Fetch(wire.fetch_to_proto(request), timeout=timeout):
            data = wire.chunk_from_proto(chunk, position)
            parts.append(data)
            position += len(data)
            if position - request.offset > limit:
                raise Unavailable(f"holder sent more than the {limit} bytes asked for")
    except grpc.RpcError as error:
        raise error_from_rpc(error) from None
    return b"".join(parts)


async def fetch_bytes(
    channel: RenewingChannel, artifact: str, offset: int, length: int, *, timeout: float = CALL_TIMEOUT_S
) -> bytes:
    """Exactly ``length`` bytes of ``artifact`` from ``offset``, or a typed error."""
    data = await _stream(channel, wire.FetchRange(artifact, offset, length, wire.DEFAULT_CHUNK_BYTES), length, timeout)
    if len(data) != length:
        raise Unavailable(f"holder ended the stream after {len(data)} of {length} bytes")
    return data


async def fetch_to_end(channel: RenewingChannel, artifact: str, *, limit: int = 64 << 20) -> bytes:
    """A whole artifact of unknown size (a manifest), refusing more than ``limit`` bytes."""
    return await _stream(channel, wire.FetchRange(artifact, 0, 0, wire.DEFAULT_CHUNK_BYTES), limit, CALL_TIMEOUT_S)
