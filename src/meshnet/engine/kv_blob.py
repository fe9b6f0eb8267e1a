"""A shard's exported KV: llama.cpp's per-sequence state behind a header naming whose it is.

llama.cpp's sequence state checks layer counts, types and row sizes, but not which layers or
which model: a middle slice's state loads into any slice of as many layers (measured: accepted,
silently wrong). So ``seal`` puts the source model's sha256, the layer range and the token
count in front, and ``unseal`` refuses a blob that is not this shard's, at this length.

llama.cpp also trusts the cells' positions: a forged state with a negative position loads and
leaves a cell ``seq_rm`` cannot remove, and duplicated positions load as if valid. Before a blob
reaches llama.cpp, ``restorable`` walks its layout (``llama_kv_cache::state_write``: per cache
the stream count, then per stream the cell count, each cell's position and sequence id, and
the layers' K and V rows) and requires what an export of an aligned prefill holds: the first
cache exactly positions ``[0, tokens)``, any further one (a sliding window's) exactly the last
``min(tokens, window)`` positions, each in one stream, and nothing after the last cache.
(Layers without V rows and M-RoPE cell extensions, which no certified family has, do not parse:
refused.)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from meshnet.core.errors import SnapshotRefused
from meshnet.core.layers import LayerRange

_MAGIC = b"MNKV"
_HEADER = struct.Struct("<4sI32sIII")
"""magic, format version, source sha256, first layer, stop layer, tokens held."""
_VERSION = 1


@dataclass(frozen=True)
class KvOwner:
    """Whose KV a blob is: a shard of the model with ``source_sha256`` running ``layers``."""

    source_sha256: str
    layers: LayerRange


def seal(owner: KvOwner, tokens: int, state: bytes) -> bytes:
    """``state`` (llama.cpp's, or a fake's) behind the header ``unseal`` checks."""
    digest = bytes.fromhex(owner.source_sha256)
    return _HEADER.pack(_MAGIC, _VERSION, digest, owner.layers.start, owner.layers.stop, tokens) + state


def unseal(owner: KvOwner, tokens: int, blob: bytes) -> memoryview:
    """The state inside ``blob``; SnapshotRefused unless it is ``owner``'s, holding ``tokens``."""
    if len(blob) < _HEADER.size:
        raise SnapshotRefused(f"a KV snapshot of {len(blob)} bytes is shorter than its header")
    magic, version, digest, start, stop, held = _HEADER.unpack_from(blob)
    if magic != _MAGIC or version != _VERSION:
        raise SnapshotRefused("not a meshnet KV snapshot of this format")
    if digest != bytes.fromhex(owner.source_sha256):
        raise SnapshotRefused("the KV snapshot is of another model")
    if (start, stop) != (owner.layers.start, owner.layers.stop):
        raise SnapshotRefused(f"the KV snapshot is of layers {start}..{stop}, this shard runs {owner.layers}")
    if held != tokens:
        raise SnapshotRefused(f"the KV snapshot holds {held} positions, not the {tokens} claimed")
    return memoryview(blob)[_HEADER.size :]


class _Reader:
    def __init__(self, data: bytes | memoryview) -> None:
        # A view: the rows are passed along by reference, never sliced into copies.
        self.data, self.offset = memoryview(data), 0

    def take(self, fmt: str) -> tuple[int, ...]:
        layout = struct.Struct("<" + fmt)
        if self.offset + layout.size > len(self.data):
            raise SnapshotRefused("the KV snapshot ends inside its cell table")
        values = layout.unpack_from(self.data, self.offset)
        self.offset += layout.size
        return values

    def raw(self, size: int) -> memoryview:
        if size < 0 or self.offset + size > len(self.data):
            raise SnapshotRefused("the KV snapshot ends inside its layers' rows")
        self.offset += size
        return self.data[self.offset - size : self.offset]


def restorable(state: bytes | memoryview, tokens: int, window: int) -> bytes:
    """llama.cpp's sequence ``state``, checked to hold exactly what an export of positions
    ``[0, tokens)`` by a model of sliding ``window`` (0: none) holds (see the module docstring),
    with each window cache given back the cells its export left out.

    llama.cpp exports a window cache without the cells the window has passed, so it would load
    the rest from cell 0 where a cold run holds position p in cell p. Attention skips masked
    cells, but a one-row step over 512 cells or more splits the cells among the threads
    (ggml's split-KV flash attention), so another layout rounds differently (gemma3 270M, 2
    threads: logits moved by 0.6). Zero-filled cells at the passed positions, masked for every
    later position exactly as the cold run's are, restore the cold layout. A window cache must
    hold exactly the window's cells, which also bounds the padding a forged blob could ask for.
    """
    reader = _Reader(state)
    # llama.cpp's magic and the exporting sequence id (llama.cpp checks the one, drops the other)
    parts: list[bytes | memoryview] = [reader.raw(8)]
    while reader.offset < len(state):
        first = len(parts) == 1
        if not first and not window:
            raise SnapshotRefused("the KV snapshot holds a window cache; this shard's model has no window")
        parts.append(_restorable_cache(reader, tokens if first else min(tokens, window), tokens))
    if len(parts) == 1:
        raise SnapshotRefused("the KV snapshot holds no cache")
    return b"".join(parts)


def _restorable_cache(reader: _Reader, held: int, tokens: int) -> bytes:
    """One cache of ``held`` cells, the reader past it: its one filled stream checked and padded
    to position 0."""
    (n_stream,) = reader.take("I")
    parts: list[bytes | memoryview] = [struct.pack("<I", n_stream)]
    filled = False
    for _ in range(n_stream):
        (count,) = reader.take("I")
        if count == 0:
            parts.append(struct.pack("<I", 0))
            continue
        if filled or count != held:
            raise SnapshotRefused(f"the KV snapshot's cells are not those of a {tokens}-token prefix")
        filled, passed = True, tokens - count
        table = reader.raw(12 * count)
        cells = [struct.unpack_from("<iIi", table, 12 * i) for i in range(count)]
        if [(p, n) for p, n, _ in cells] != [(p, 1) for p in range(passed, tokens)]:
            raise SnapshotRefused(f"the KV snapshot's cells are not the positions of a {tokens}-token prefix")
        filler = b"".join(struct.pack("<iIi", p, 1, 0) for p in range(passed))
        parts += [struct.pack("<I", tokens), filler, table, _padded_rows(reader, count, passed)]
    if not filled:
        raise SnapshotRefused("the KV snapshot holds a cache without cells")
    return b"".join(parts)


def _padded_rows(reader: _Reader, cells: int, passed: int) -> bytes:
    """The layers' K and V rows of ``cells`` cells, ``passed`` zero cells put in front (each
    layer's rows are read, so bounded by the blob, before any padding is made)."""
    v_trans, n_layer = reader.take("II")
    parts: list[bytes | memoryview] = [struct.pack("<II", v_trans, n_layer)]
    for _ in range(n_layer):
        kind, row = reader.take("iQ")
        rows = reader.raw(row * cells)
        parts += [struct.pack("<iQ", kind, row), bytes(row * passed), rows]
    for _ in range(n_layer):
        if not v_trans:
            kind, row = reader.take("iQ")
            rows = reader.raw(row * cells)
            parts += [struct.pack("<iQ", kind, row), bytes(row * passed), rows]
            continue
        # Transposed V: per embedding dimension, one element per cell.
        kind, element, width = reader.take("iII")
        values = np.frombuffer(reader.raw(element * width * cells), np.uint8).reshape(width, element * cells)
        padded = np.zeros((width, element * (passed + cells)), np.uint8)
        padded[:, element * passed :] = values
        parts += [struct.pack("<iII", kind, element, width), padded.tobytes()]
    return b"".join(parts)
