"""The KV snapshot container: a header binding an exported slot to its recipe, layers, session,
positions and tokens, and the exported bytes; refused whole unless every binding holds.

Layout: ``MAGIC``, the header's length (u32, little endian), the header (JSON), the payload (an
``export_slot`` blob). The header names the payload's length and sha256, so a truncated,
oversized or corrupt file is refused here, before llama.cpp ever sees a byte of it; so is one of
another recipe, layer range, session, length or token binding (``core.snapshot``). Shards after
the head write ``UNBOUND`` as the token link (they never see a token) and the head its chain.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass

from meshnet.core.errors import SnapshotRefused
from meshnet.core.ids import SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.snapshot import TOKEN_LINK_BYTES

MAGIC = b"MNKVSNAP"
FORMAT_VERSION = 1
MAX_HEADER_BYTES = 4096
_LENGTH = struct.Struct("<I")


@dataclass(frozen=True)
class SnapshotHeader:
    fingerprint: str
    layers: LayerRange
    session_id: SessionId
    positions: int
    tokens_link: bytes
    payload_sha256: bytes
    payload_bytes: int
    version: int = FORMAT_VERSION

    def to_json(self) -> bytes:
        fields = {
            "version": self.version,
            "fingerprint": self.fingerprint,
            "layers": [self.layers.start, self.layers.stop],
            "session": self.session_id,
            "positions": self.positions,
            "tokens": self.tokens_link.hex(),
            "payload_sha256": self.payload_sha256.hex(),
            "payload_bytes": self.payload_bytes,
        }
        return json.dumps(fields, sort_keys=True).encode()


@dataclass(frozen=True)
class Expected:
    """What a shard requires of a snapshot it restores (``tokens_link`` None: not checked, the
    probe's answer, which only lists what is held)."""

    fingerprint: str
    layers: LayerRange
    session_id: SessionId
    positions: int | None = None
    tokens_link: bytes | None = None


def pack(
    fingerprint: str, layers: LayerRange, session_id: SessionId, positions: int, tokens: bytes, blob: bytes
) -> bytes:
    """The snapshot file of ``blob`` (a slot's KV of ``positions`` positions)."""
    header = SnapshotHeader(
        fingerprint, layers, session_id, positions, tokens, hashlib.sha256(blob).digest(), len(blob)
    ).to_json()
    return MAGIC + _LENGTH.pack(len(header)) + header + blob


def read_header(data: bytes) -> tuple[SnapshotHeader, int]:
    """The header of a snapshot file and where its payload starts; SnapshotRefused if malformed."""
    if data[: len(MAGIC)] != MAGIC or len(data) < len(MAGIC) + _LENGTH.size:
        raise SnapshotRefused("not a meshnet KV snapshot")
    (size,) = _LENGTH.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + _LENGTH.size
    if size > MAX_HEADER_BYTES or len(data) < start + size:
        raise SnapshotRefused(f"a snapshot header of {size} bytes (file of {len(data)})")
    try:
        fields = json.loads(data[start : start + size])
        header = SnapshotHeader(
            fingerprint=str(fields["fingerprint"]),
            layers=LayerRange(int(fields["layers"][0]), int(fields["layers"][1])),
            session_id=SessionId(str(fields["session"])),
            positions=int(fields["positions"]),
            tokens_link=bytes.fromhex(fields["tokens"]),
            payload_sha256=bytes.fromhex(fields["payload_sha256"]),
            payload_bytes=int(fields["payload_bytes"]),
            version=int(fields["version"]),
        )
    except (ValueError, KeyError, TypeError, IndexError) as error:
        raise SnapshotRefused(f"a snapshot header that does not parse: {error}") from None
    if header.version != FORMAT_VERSION or len(header.tokens_link) != TOKEN_LINK_BYTES:
        raise SnapshotRefused(f"a snapshot of format {header.version} (this node reads {FORMAT_VERSION})")
    return header, start + size


def unpack(data: bytes, expected: Expected) -> tuple[SnapshotHeader, bytes]:
    """The header and payload of ``data``, refused (SnapshotRefused) unless whole and what
    ``expected`` asks for."""
    header, start = read_header(data)
    if len(data) != start + header.payload_bytes:
        raise SnapshotRefused(
            f"a snapshot of {len(data) - start} payload bytes where its header says {header.payload_bytes}"
        )
    check(header, expected)
    payload = data[start:]
    if hashlib.sha256(payload).digest() != header.payload_sha256:
        raise SnapshotRefused("a snapshot whose payload does not match its hash (corrupt)")
    return header, payload


def check(header: SnapshotHeader, expected: Expected) -> None:
    """SnapshotRefused unless ``header`` is of ``expected``'s recipe, layers, session and tokens."""
    if header.fingerprint != expected.fingerprint:
        raise SnapshotRefused(f"a snapshot of recipe {header.fingerprint[:16]}, not this shard's")
    if header.layers != expected.layers:
        raise SnapshotRefused(f"a snapshot of layers {header.layers}, this shard runs {expected.layers}")
    if header.session_id != expected.session_id:
        raise SnapshotRefused("a snapshot of another session")
    if expected.positions is not None and header.positions != expected.positions:
        raise SnapshotRefused(f"a snapshot of {header.positions} positions, not {expected.positions}")
    if expected.tokens_link is not None and header.tokens_link != expected.tokens_link:
        raise SnapshotRefused(f"a snapshot of other tokens than the session's first {header.positions}")
