"""artifact.proto messages <-> typed values, both directions, validated at the edge.

Holders and the tracker decode requests here before touching any state; fetchers decode
replies here and treat a malformed one as the peer's fault (``Unavailable``), so a bad holder
is dropped like a dead one. Chunk bytes are checked against their CRC-32 on decode.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from meshnet.artifact.directory import SHA256_HEX, Advertisement, FoundHolders, HeldManifest, HolderInfo
from meshnet.core.checks import check_text
from meshnet.core.errors import IntegrityError, InvalidArgument, Unavailable
from meshnet.wire.generated import artifact_pb2 as pb

MAX_CHUNK_BYTES = 1 << 20
DEFAULT_CHUNK_BYTES = 256 << 10
MAX_FIND = 1 << 16


@dataclass(frozen=True)
class FetchRange:
    artifact: str
    offset: int
    length: int
    """0: to the end of the artifact."""
    chunk_bytes: int


def _digest(field: str, value: str) -> str:
    if not SHA256_HEX.match(value):
        raise InvalidArgument(f"{field} {value[:70]!r} is not 64 lowercase hex digits")
    return value


def fetch_to_proto(request: FetchRange) -> pb.ArtifactFetchRequest:
    return pb.ArtifactFetchRequest(
        artifact_sha256=request.artifact,
        offset=request.offset,
        length=request.length,
        max_chunk_bytes=request.chunk_bytes,
    )


def fetch_from_proto(message: pb.ArtifactFetchRequest) -> FetchRange:
    chunk = message.max_chunk_bytes or DEFAULT_CHUNK_BYTES
    return FetchRange(
        _digest("artifact_sha256", message.artifact_sha256),
        message.offset,
        message.length,
        min(chunk, MAX_CHUNK_BYTES),
    )


def chunk_to_proto(offset: int, data: bytes) -> pb.ArtifactChunk:
    return pb.ArtifactChunk(offset=offset, data=data, crc32=zlib.crc32(data))


def chunk_from_proto(message: pb.ArtifactChunk, expected_offset: int) -> bytes:
    """The chunk's bytes; IntegrityError if they were damaged, Unavailable if out of order."""
    if message.offset != expected_offset or len(message.data) > MAX_CHUNK_BYTES:
        raise Unavailable(f"holder sent a chunk at {message.offset}, expected {expected_offset}")
    if zlib.crc32(message.data) != message.crc32:
        raise IntegrityError(f"chunk at offset {message.offset} failed its CRC-32")
    return bytes(message.data)


def advertisement_to_proto(advertisement: Advertisement) -> pb.ArtifactAdvertisement:
    return pb.ArtifactAdvertisement(
        holder_id=advertisement.holder_id,
        address=advertisement.address,
        artifacts=sorted(advertisement.artifacts),
        manifests=[
            pb.ArtifactAdvertisement.HeldManifest(model_id=m.model_id, manifest_sha256=m.manifest_sha256)
            for m in advertisement.manifests
        ],
    )


def advertisement_from_proto(message: pb.ArtifactAdvertisement) -> Advertisement:
    check_text("holder_id", message.holder_id)
    check_text("address", message.address)
    for manifest in message.manifests:
        check_text("model_id", manifest.model_id)
    return Advertisement(
        message.holder_id,
        message.address,
        frozenset(message.artifacts),
        tuple(HeldManifest(m.model_id, m.manifest_sha256) for m in message.manifests),
    )


def advertisement_ack_to_proto(ttl_s: float, interval_s: float) -> pb.ArtifactAdvertisementAck:
    return pb.ArtifactAdvertisementAck(ttl_ms=int(ttl_s * 1000), interval_ms=int(interval_s * 1000))


def advertisement_ack_from_proto(message: pb.ArtifactAdvertisementAck) -> float:
    """Seconds until the next announcement is due."""
    return max(message.interval_ms, 100) / 1000


def find_to_proto(model_id: str, artifacts: tuple[str, ...]) -> pb.FindHoldersRequest:
    return pb.FindHoldersRequest(model_id=model_id, artifacts=list(artifacts))


def find_from_proto(message: pb.FindHoldersRequest) -> tuple[str, tuple[str, ...]]:
    if message.model_id:
        check_text("model_id", message.model_id)
    if len(message.artifacts) > MAX_FIND:
        raise InvalidArgument(f"FindHolders asks for {len(message.artifacts)} artifacts, at most {MAX_FIND}")
    return message.model_id, tuple(_digest("artifacts", a) for a in message.artifacts)


def found_to_proto(found: FoundHolders) -> pb.FindHoldersReply:
    return pb.FindHoldersReply(
        holders=[
            pb.FindHoldersReply.Holder(holder_id=h.holder_id, address=h.address, artifacts=list(h.artifacts))
            for h in found.holders
        ],
        manifest_sha256=list(found.manifests),
    )


def found_from_proto(message: pb.FindHoldersReply) -> FoundHolders:
    try:
        holders = tuple(
            HolderInfo(h.holder_id, h.address, tuple(_digest("artifacts", a) for a in h.artifacts))
            for h in message.holders
        )
        manifests = tuple(_digest("manifest_sha256", m) for m in message.manifest_sha256)
    except InvalidArgument as error:
        raise Unavailable(f"the tracker answered FindHolders with a malformed reply: {error.message}") from None
    return FoundHolders(holders, manifests)
