"""Fixed-size pieces of an artifact, their hashes and the Merkle root over them.

An artifact is cut into ``PIECE_SIZE`` pieces (the last may be shorter); each piece is checked
against its sha256 before a fetcher writes it, so a bad holder costs at most one piece. The
manifest lists every piece hash (BitTorrent v2's "piece layer") and the binary Merkle root over
them: leaves are the piece hashes, padded to a power of two with all-zero hashes, each parent is
``sha256(left || right)`` (BEP 52's construction, at piece granularity).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import BinaryIO

PIECE_SIZE = 1 << 20
_ZERO = bytes(32)


@dataclass(frozen=True)
class PieceDigests:
    """What an artifact's bytes hash to: whole-file sha256, per-piece sha256s and their root."""

    size: int
    sha256: str
    piece_size: int
    pieces: tuple[str, ...]
    merkle_root: str


def piece_count(size: int, piece_size: int) -> int:
    return max(1, -(-size // piece_size))


def piece_span(index: int, size: int, piece_size: int) -> tuple[int, int]:
    """``(offset, length)`` of piece ``index`` of an artifact of ``size`` bytes."""
    start = index * piece_size
    return start, max(0, min(piece_size, size - start))


def merkle_root(piece_hashes: Sequence[bytes]) -> bytes:
    layer = list(piece_hashes) or [hashlib.sha256(b"").digest()]
    width = 1
    while width < len(layer):
        width *= 2
    layer += [_ZERO] * (width - len(layer))
    while len(layer) > 1:
        layer = [hashlib.sha256(layer[i] + layer[i + 1]).digest() for i in range(0, len(layer), 2)]
    return layer[0]


def digest_stream(chunks: Iterable[bytes], piece_size: int = PIECE_SIZE) -> PieceDigests:
    """Hash a stream of bytes (any chunking) into its piece digests."""
    whole = hashlib.sha256()
    pieces: list[bytes] = []
    current = hashlib.sha256()
    filled = 0
    size = 0
    for chunk in chunks:
        whole.update(chunk)
        size += len(chunk)
        view = memoryview(chunk)
        while len(view):
            take = min(piece_size - filled, len(view))
            current.update(view[:take])
            filled += take
            view = view[take:]
            if filled == piece_size:
                pieces.append(current.digest())
                current, filled = hashlib.sha256(), 0
    if filled or not pieces:
        pieces.append(current.digest())
    return PieceDigests(size, whole.hexdigest(), piece_size, tuple(p.hex() for p in pieces), merkle_root(pieces).hex())


def digest_file(handle: BinaryIO, piece_size: int = PIECE_SIZE) -> PieceDigests:
    return digest_stream(iter(lambda: handle.read(piece_size), b""), piece_size)
