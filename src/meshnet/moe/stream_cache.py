"""Routed experts streamed from the model file into a bounded resident set (``--expert-cache-mb``).

The kernels read the experts through llama.cpp's mapping of the GGUF, so the cache's storage is
that mapping and its bound is enforced on it: each MoE layer, once the router has chosen (and
before ``mul_mat_id`` reads anything), the experts the layer will read are admitted to a
byte-bounded LRU (``moe/cache_policy.py``). An evicted expert's pages leave the process
(``madvise(MADV_DONTNEED)``) and the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``, so its
next miss reads the disk, unless another process maps those pages); a missed expert's bytes are
read from the file with ``os.pread`` into the page cache, where the kernels' page faults find
them. The bytes are the file's either way, so the output does not change.

Weights repacked at load (Q4_0 on CPUs with the repacking kernels) are read from a copy, not the
file: the cache cannot bound those, and refuses them at the first expert multiplication. Loaded
without repacking (``LlamaConfig.repack``, ``--no-repack``) they are read from the mapping too.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections import defaultdict
from pathlib import Path

import numpy as np

from meshnet.core.errors import EngineError
from meshnet.moe.cache_policy import CacheCounters, ExpertKey, ExpertLru
from meshnet.moe.memory import MADV_DONTNEED, _file_mappings, _inner_pages, _madvise
from meshnet.moe.shape import MoeShape

log = logging.getLogger(__name__)


def _layer_of(tensor: str) -> int:
    return int(tensor.split(".")[1])  # "blk.L.ffn_gate_exps.weight"


class ExpertStreamCache:
    def __init__(self, path: Path, moe: MoeShape, capacity_bytes: int) -> None:
        self._spans: dict[ExpertKey, list[tuple[int, int]]] = defaultdict(list)
        for span in moe.spans:
            self._spans[(_layer_of(span.tensor), span.expert)].append((span.offset, span.nbytes))
        self.lru = ExpertLru(capacity_bytes, {k: sum(n for _, n in v) for k, v in self._spans.items()})
        self._path = Path(path)
        self._fd = os.open(self._path, os.O_RDONLY)
        self._scratch = bytearray(max(n for spans in self._spans.values() for _, n in spans))
        self._madvise = _madvise()
        self._mappings: list[tuple[int, int, int]] = []
        self._checked: set[str] = set()
        self._n_tensors = 3 * moe.n_layers

    def attach(self) -> None:
        """After the model is loaded: find its mapping, and start with nothing resident."""
        self._mappings = _file_mappings(self._path)
        for key in self._spans:
            self._drop(key)

    @property
    def checked(self) -> bool:
        return len(self._checked) >= self._n_tensors

    def check_tensor(self, name: str, data: int) -> None:
        """The kernels must read ``name`` from the file mapping, or the cache bounds nothing."""
        if name in self._checked:
            return
        if not any(start <= data < stop for start, stop, _ in self._mappings):
            raise EngineError(
                f"{name} was copied (repacked) at load, so the expert cache cannot bound it; "
                "load without repacking (--no-repack, part of the recipe) to serve it with --expert-cache-mb"
            )
        self._checked.add(name)

    def on_layer(self, layer: int, experts: np.ndarray) -> None:
        """The experts layer ``layer`` reads now (every slot's id, dummies included)."""
        decision = self.lru.admit((layer, int(e)) for e in np.unique(experts))
        for key in decision.evicted:
            self._drop(key)
        for key in decision.misses:
            for offset, nbytes in self._spans[key]:
                view = memoryview(self._scratch)[:nbytes]
                if os.preadv(self._fd, [view], offset) != nbytes:
                    raise EngineError(f"short read of expert {key[1]} of layer {key[0]} from {self._path.name}")

    def settle(self) -> None:
        """After a run: unmap again every expert the cache does not hold. The kernel maps more
        than was faulted (fault-around, large page-cache folios spanning neighbouring experts;
        measured: +100 MB of a 214 MB model's experts in one step with a 27 MB cache), so the
        bound holds between runs, not inside one."""
        resident = self.lru.resident_keys
        for key in self._spans:
            if key not in resident:
                self._unmap(key)

    def _drop(self, key: ExpertKey) -> None:
        self._unmap(key)
        for offset, nbytes in self._spans[key]:
            # Unmapped now, so the kernel can drop them from the page cache too: a miss reads the disk.
            os.posix_fadvise(self._fd, offset, nbytes, os.POSIX_FADV_DONTNEED)

    def _unmap(self, key: ExpertKey) -> None:
        for offset, nbytes in self._spans[key]:
            for start, stop, file_offset in self._mappings:
                if file_offset <= offset and offset + nbytes <= file_offset + stop - start:
                    first, length = _inner_pages(start + offset - file_offset, nbytes)
                    if length and self._madvise is not None and self._madvise(first, length, MADV_DONTNEED) != 0:
                        log.warning("madvise failed (errno %d): evicted experts stay resident", ctypes.get_errno())
                        self._madvise = None

    @property
    def counters(self) -> CacheCounters:
        return self.lru.counters

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
