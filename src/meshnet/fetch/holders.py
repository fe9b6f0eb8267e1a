"""Clients of the artifact plane: byte ranges from a holder, and the tracker's holder directory.

Channel creation is one function (``artifact_channel``): mTLS with the swarm identity when one
is given, pinned to ``TRACKER_NAME`` for the directory and to a worker's name for a holder
(seeders join as workers), plaintext on loopback otherwise. Every call has a deadline; failures arrive as typed
errors (``protocol.status``). A holder's reply is checked chunk by chunk (order, CRC-32, exact
length); the piece hashes are the fetcher's business (``artifact_fetch``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import grpc.aio

from meshnet.artifact.directory import Advertisement, FoundHolders
from meshnet.core.errors import MeshnetError, Unavailable
from meshnet.wire import artifact_wire as wire
from meshnet.wire import services
from meshnet.wire.status import error_from_rpc
from meshnet.wire.tls import ANY_WORKER_NAME, TRACKER_NAME, LinkSecurity, link_options, secure_or_plain_channel

logger = logging.getLogger(__name__)

CALL_TIMEOUT_S = 10.0
ANNOUNCE_BACKOFF_S = (0.2, 5.0)


def artifact_channel_options() -> list[tuple[str, Any]]:
    return link_options(wire.MAX_CHUNK_BYTES + (64 << 10))


def artifact_channel(
    address: str, security: LinkSecurity | None = None, server_name: str = ANY_WORKER_NAME
) -> grpc.aio.Channel:
    """A channel to a holder (any worker-role node of the swarm by default) or, named so, the tracker."""
    return secure_or_plain_channel(address, security, server_name, artifact_channel_options())


async def _stream(channel: grpc.aio.Channel, request: wire.FetchRange, limit: int, timeout: float) -> bytes:
    """The bytes a Fetch streams, in order and CRC-checked, refusing more than ``limit``."""
    parts: list[bytes] = []
    position = request.offset
    try:
        async for chunk in services.ArtifactsStub(channel).Fetch(wire.fetch_to_proto(request), timeout=timeout):
            data = wire.chunk_from_proto(chunk, position)
            parts.append(data)
            position += len(data)
            if position - request.offset > limit:
                raise Unavailable(f"holder sent more than the {limit} bytes asked for")
    except grpc.RpcError as error:
        raise error_from_rpc(error) from None
    return b"".join(parts)


async def fetch_bytes(
    channel: grpc.aio.Channel, artifact: str, offset: int, length: int, *, timeout: float = CALL_TIMEOUT_S
) -> bytes:
    """Exactly ``length`` bytes of ``artifact`` from ``offset``, or a typed error."""
    data = await _stream(channel, wire.FetchRange(artifact, offset, length, wire.DEFAULT_CHUNK_BYTES), length, timeout)
    if len(data) != length:
        raise Unavailable(f"holder ended the stream after {len(data)} of {length} bytes")
    return data


async def fetch_to_end(channel: grpc.aio.Channel, artifact: str, *, limit: int = 64 << 20) -> bytes:
    """A whole artifact of unknown size (a manifest), refusing more than ``limit`` bytes."""
    return await _stream(channel, wire.FetchRange(artifact, 0, 0, wire.DEFAULT_CHUNK_BYTES), limit, CALL_TIMEOUT_S)


async def find_holders(
    tracker: str, model_id: str, artifacts: tuple[str, ...] = (), security: LinkSecurity | None = None
) -> FoundHolders:
    async with artifact_channel(tracker, security, TRACKER_NAME) as channel:
        stub = services.ArtifactDirectoryStub(channel)
        try:
            reply = await stub.FindHolders(wire.find_to_proto(model_id, artifacts), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
    return wire.found_from_proto(reply)


async def announce(channel: grpc.aio.Channel, advertisement: Advertisement) -> float:
    """Announce once; the seconds until the next announcement is due."""
    stub = services.ArtifactDirectoryStub(channel)
    try:
        reply = await stub.Advertise(wire.advertisement_to_proto(advertisement), timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as error:
        raise error_from_rpc(error) from None
    return wire.advertisement_ack_from_proto(reply)


async def announce_forever(tracker: str, advertisement: Advertisement, security: LinkSecurity | None = None) -> None:
    """Keep ``advertisement`` live at the tracker until cancelled, riding out tracker restarts.

    A renewed certificate (``security.generation`` moved) gets a new channel: the old one would
    keep presenting the certificate it was opened with until that expires."""
    backoff = ANNOUNCE_BACKOFF_S[0]
    while True:
        generation = None if security is None else security.generation
        async with artifact_channel(tracker, security, TRACKER_NAME) as channel:
            while generation == (None if security is None else security.generation):
                try:
                    delay = await announce(channel, advertisement)
                    backoff = ANNOUNCE_BACKOFF_S[0]
                except MeshnetError as error:
                    logger.warning("announcing artifacts to %s failed: %s", tracker, error.message)
                    delay, backoff = backoff, min(backoff * 2, ANNOUNCE_BACKOFF_S[1])
                await asyncio.sleep(delay)
