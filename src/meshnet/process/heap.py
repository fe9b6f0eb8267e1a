"""Handing freed heap back to the kernel, so a worker's resident size follows what it holds.

glibc serves a large ``malloc`` from a mapping of its own, returned to the kernel on ``free``,
only until the first such block is freed: from then on it raises its mmap threshold to that
block's size (up to 32 MiB) and serves later ones from the heap, where a freed block stays
resident unless it lies at the heap's top. A shard's prefix reuse store churns exactly such
blocks: each export of a prompt's KV is MiBs, built through transient copies, and an entry
evicted or refused to stay within the store's share of the budget is freed at once. Measured
on the README's three SmolLM2 machines (340 MiB budgets) under 8 concurrent long prompts: a
middle worker whose store had 8.5 MiB left in its budget held 29 MiB more than with no store
at all (``scripts/measure_worker_memory.py``). ``malloc_trim`` returns every free page of every
arena, the heap's middle included; called after an export, it keeps the store within its share.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_free_heap() -> bool:
    """Give the heap's free pages back to the kernel (``malloc_trim(0)``); False where the C
    library cannot (nothing to do there: its allocator returns large blocks itself or not at all)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
