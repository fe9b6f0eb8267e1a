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
from pathlib import Path

import numpy as np

from meshnet.moe.ownership import ExpertOwnership

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
        self._mappings: list[tuple[int, int, int]] = []
        self._file_pages: dict[str, list[tuple[int, int]]] = {}

    @property
    def complete(self) -> bool:
        """Every stacked expert tensor has been seen once: nothing is left to watch."""
        return len(self._done) >= self._n_tensors

    def release(self, weights_address: int, name: str, data: int, expert_stride: int, n_expert: int) -> None:
        """``weights``: the stacked tensor ``name``, [n_expert] x ``expert_stride`` bytes at ``data``."""
        if weights_address in self._done or self._madvise is None or not data:
            return
        self._done.add(weights_address)
        self._release_copied(name, data)
        for expert in self._foreign:
            if expert < n_expert:
                start = data + expert * expert_stride
                first, last = -(-start // _PAGE) * _PAGE, (start + expert_stride) // _PAGE * _PAGE
                if last > first:
                    self._ranges.append((first, last - first))
                    self.released_bytes += last - first
        self.release_again()

    def add_file_spans(self, path: Path, spans: list[tuple[str, int, int, int]]) -> None:
        """Also release the foreign experts' pages of ``path``'s mmap: ``(tensor, expert, file offset, bytes)``.

        With repacked weights the kernels read a copy, and llama.cpp keeps the mapping of the
        whole file; without repacking these are the very pages the tensors use."""
        foreign = set(self._foreign)
        self._mappings = _file_mappings(path)
        for start, stop, offset in self._mappings:
            for tensor, expert, file_offset, nbytes in spans:
                if offset <= file_offset and file_offset + nbytes <= offset + stop - start:
                    page_range = _inner_pages(start + file_offset - offset, nbytes)
                    self._file_pages.setdefault(tensor, []).append(page_range)
                    if expert in foreign:
                        self._ranges.append(page_range)
        self.release_again()

    def _release_copied(self, name: str, data: int) -> None:
        """A tensor whose data lies outside the file mapping was copied at load (repacked): none of
        its file pages are read again, owned experts' included."""
        if not any(start <= data < stop for start, stop, _ in self._mappings):
            self._ranges += self._file_pages.pop(name, [])

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


def _inner_pages(begin: int, nbytes: int) -> tuple[int, int]:
    """The whole pages inside ``[begin, begin + nbytes)``, as ``(start, length)`` (length may be 0)."""
    first, last = -(-begin // _PAGE) * _PAGE, (begin + nbytes) // _PAGE * _PAGE
    return first, max(last - first, 0)


def _file_mappings(path: Path) -> list[tuple[int, int, int]]:
    """``(start, stop, file offset)`` of this process's mappings of ``path`` (Linux; else none)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return []
    target = str(Path(path).resolve())
    found = []
    for line in maps.read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5] == target:
            start, stop = (int(x, 16) for x in parts[0].split("-"))
            found.append((start, stop, int(parts[2], 16)))
    return found
