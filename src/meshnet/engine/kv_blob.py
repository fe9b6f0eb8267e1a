"""A shard's exported KV: llama.cpp's per-sequence state behind a header naming whose it is.

llama.cpp's sequence state checks layer counts, types and row sizes, but not which layers or
which model: a middle slice's state loads into any slice of as many layers (measured: accepted,
silently wrong). So ``seal`` puts the source model's sha256, the layer range and the token
count in front, and ``unseal`` refuses a blob that is not this shard's, at this length.

llama.cpp also trusts the cells' positions: a forged state with a negative position loads and
leaves a cell ``seq_rm`` cannot remove, and duplicated positions load as if valid. Before a blob
reaches llama.cpp, ``check_cells`` walks its layout (``llama_kv_cache::state_write``: per cache
the stream count, then per stream the cell count, each cell's position and sequence ids, and
the layers' K and V rows) and requires what an export of an aligned prefill holds: the first
cache exactly positions ``[0, tokens)``, any further one (a sliding window's) a contiguous run
ending at ``tokens - 1``, in one stream, and nothing after the last cache.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

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


def unseal(owner: KvOwner, tokens: int, blob: bytes) -> bytes:
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
    return blob[_HEADER.size :]


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.offset = data, 0

    def take(self, fmt: str) -> tuple[int, ...]:
        layout = struct.Struct("<" + fmt)
        if self.offset + layout.size > len(self.data):
            raise SnapshotRefused("the KV snapshot ends inside its cell table")
        values = layout.unpack_from(self.data, self.offset)
        self.offset += layout.size
        return values

    def skip(self, size: int) -> None:
        if size < 0 or self.offset + size > len(self.data):
            raise SnapshotRefused("the KV snapshot ends inside its layers' rows")
        self.offset += size


def check_cells(state: bytes, tokens: int) -> None:
    """SnapshotRefused unless llama.cpp's sequence ``state`` holds exactly what an export of
    positions ``[0, tokens)`` holds (see the module docstring)."""
    reader = _Reader(state)
    reader.take("Ii")  # llama.cpp's magic and the exporting sequence id (llama.cpp checks the one, drops the other)
    first = True
    while reader.offset < len(state):
        positions = _read_cache(reader)
        full = list(range(tokens)) if first else list(range(tokens - len(positions), tokens))
        if not positions or positions != full:
            raise SnapshotRefused(f"the KV snapshot's cells are not the positions of a {tokens}-token prefix")
        first = False
    if first:
        raise SnapshotRefused("the KV snapshot holds no cache")


def _read_cache(reader: _Reader) -> list[int]:
    """One cache's cells (positions, in order), the reader past its rows."""
    (n_stream,) = reader.take("I")
    positions: list[int] = []
    for _ in range(n_stream):
        (cell_count,) = reader.take("I")
        if cell_count == 0:
            continue
        if positions:
            raise SnapshotRefused("the KV snapshot fills more than one stream")
        for _ in range(cell_count):
            position, n_seq_id = reader.take("iI")
            if n_seq_id != 1:
                raise SnapshotRefused("a KV snapshot cell names other than one sequence")
            reader.take("i")
            positions.append(position)
        _skip_rows(reader, cell_count)
    return positions


def _skip_rows(reader: _Reader, cells: int) -> None:
    v_trans, n_layer = reader.take("II")
    for _ in range(n_layer):
        _, row = reader.take("iQ")
        reader.skip(row * cells)
    for _ in range(n_layer):
        if v_trans:
            _, element, width = reader.take("iII")
            reader.skip(element * width * cells)
        else:
            _, row = reader.take("iQ")
            reader.skip(row * cells)
