"""Give back the memory of routed experts this node never reads.

llama.cpp loads every expert (the mmap is populated, repacking copies whole expert tensors), but
``mul_mat_id`` reads only the experts a slot selects, and on an expert-parallel node that is
only its own experts and its dummies. The first time each stacked expert tensor is multiplied,
its other experts' pages are released with ``madvise(MADV_DONTNEED)``: file-backed pages leave
the resident set (a later touch would read them back from the file); anonymous (repacked) pages
are dropped (a later touch would read zeros, which only a non-local slot could do, and its rows
are replaced). Each expert's bytes are ``nb[2]`` apart in the tensor; ranges are cut inward to
whole pages, so partial pages at an expert's edges stay.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
from collections.abc import Callable

import numpy as np

from meshnet.core.experts import ExpertOwnership

log = logging.getLogger(__name__)
MADV_DONTNEED = 4
_PAGE = mmap.PAGESIZE


def _madvise() -> Callable[[int, int, int], int] | None:
    if os.name != "posix":
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    function = libc.madvise
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


class ForeignExpertRelease:
    """Releases, once per stacked expert tensor, the experts neither owned nor used as dummies."""

    def __init__(self, ownership: ExpertOwnership, dummies: np.ndarray, n_expert: int, n_tensors: int) -> None:
        kept = set(ownership.owned_experts(n_expert)) | {int(d) for d in dummies}
        self._foreign = [e for e in range(n_expert) if e not in kept]
        self._done: set[int] = set()
        self._madvise = _madvise()
        self.released_bytes = 0
        self._n_tensors = n_tensors
        self._ranges: list[tuple[int, int]] = []

    @property
    def complete(self) -> bool:
        """Every stacked expert tensor has been seen once: nothing is left to watch."""
        return len(self._done) >= self._n_tensors

    def release(self, weights_address: int, data: int, expert_stride: int, n_expert: int) -> None:
        """``weights``: the stacked tensor [n_expert] x ``expert_stride`` bytes at ``data``."""
        if weights_address in self._done or self._madvise is None or not data:
            return
        self._done.add(weights_address)
        for expert in self._foreign:
            if expert < n_expert:
                start = data + expert * expert_stride
                first, last = -(-start // _PAGE) * _PAGE, (start + expert_stride) // _PAGE * _PAGE
                if last > first:
                    self._ranges.append((first, last - first))
                    self.released_bytes += last - first
        self.release_again()

    def release_again(self) -> None:
        """Drop the foreign pages once more: something in llama.cpp's first decode graph maps
        them back (measured: the model mapping's RSS regrows by every foreign byte on the first
        single-token step, then by fault-around only), so the node releases after every run."""
        if self._madvise is None:
            return
        for first, length in self._ranges:
            if self._madvise(first, length, MADV_DONTNEED) != 0:
                log.warning("madvise failed (errno %d): foreign experts stay resident", ctypes.get_errno())
                self._madvise = None
                return
