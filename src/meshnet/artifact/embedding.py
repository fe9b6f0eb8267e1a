"""The head's token-embedding lookup, done outside llama.cpp.

Head slices carry no vocabulary-sized tensor (see ``slicing``); the head keeps the source table
quantized in a memory-mapped embedding file and dequantizes only the rows of the tokens it is
given. ``gguf``'s NumPy dequantizers reproduce ggml's ``get_rows`` bit for bit for the types the
pinned build uses (checked by the engine's start-up certification).
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from meshnet.artifact.architectures import adapter_for
from meshnet.artifact.gguf_file import GGML_BLOCKS
from meshnet.artifact.slicing import verify_slice
from meshnet.core.errors import InvalidArgument


class EmbeddingTable:
    """Row lookups into a quantized ``[n_vocab, n_embd]`` table without loading all of it."""

    def __init__(self, path: Path, *, source_sha256: str | None = None) -> None:
        model, provenance = verify_slice(path, source_sha256=source_sha256, role="embedding")
        if len(model.tensors) != 1:
            raise InvalidArgument(f"{Path(path).name}: an embedding file holds exactly one tensor")
        (info,) = model.tensors.values()
        self.source_sha256 = provenance.source_sha256
        self.n_embd, self.n_vocab = info.shape[0], (info.shape[1] if len(info.shape) > 1 else 1)
        self._qtype = GGMLQuantizationType(info.ggml_type)
        # The graph scales token input only (Gemma: sqrt(n_embd)); rows fed as embeddings must
        # arrive scaled already. One float32 multiply, as ggml_scale does it.
        scale = adapter_for(model.architecture).token_input_scale(self.n_embd)
        self._scale = None if scale == 1.0 else np.float32(scale)
        block_size, type_size = GGML_BLOCKS[info.ggml_type]
        self._row_bytes = self.n_embd // block_size * type_size
        self._handle = open(path, "rb")  # noqa: SIM115 - lives as long as the table
        self._map = mmap.mmap(self._handle.fileno(), 0, access=mmap.ACCESS_READ)
        start = model.data_offset + info.offset
        # rows: [n_vocab, row_bytes] raw quantized bytes, paged in only when touched.
        self._rows = np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=start).reshape(
            self.n_vocab, self._row_bytes
        )

    def lookup(self, token_ids: np.ndarray) -> np.ndarray:
        """float32 [n, n_embd] embeddings of ``token_ids`` (int32 [n])."""
        if token_ids.ndim != 1 or token_ids.size == 0:
            raise InvalidArgument("token ids must be a non-empty 1-D array")
        low, high = int(token_ids.min()), int(token_ids.max())
        if low < 0 or high >= self.n_vocab:
            raise InvalidArgument(f"token id out of range [0, {self.n_vocab}): saw {low}..{high}")
        raw = self._rows[token_ids]
        if self._qtype == GGMLQuantizationType.F32:
            rows = np.ascontiguousarray(raw.view(np.float32))
        else:
            rows = np.ascontiguousarray(dequantize(raw, self._qtype), dtype=np.float32)
        if self._scale is not None:
            rows *= self._scale
        return rows

    def close(self) -> None:
        del self._rows
        self._map.close()
        self._handle.close()
