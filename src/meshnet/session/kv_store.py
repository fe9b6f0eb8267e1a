"""One shard's store of reusable KV: prompt prefixes and session snapshots, in a byte budget.

Each entry is the KV of this shard's layers for the positions ``[0, tokens)`` of some token
sequence, as the engine exports a sequence (``Backend.export_slot``), keyed by the sequence's
prefix chain (``core.prefix``): entry ``e`` serves a request whose chain starts with ``e.chain``.
An entry serves only its own length: a shorter prefix cut from a longer entry would be wrong
under a sliding window (the window of the cut point is gone from the longer entry's cache).

The store lives on the event loop (one thread) and knows nothing of llama.cpp: the blobs are
opaque bytes. Eviction is least-recently-used within ``budget_bytes``; an entry a probe found
is leased for a while (``pin``), so the session the probe was for finds it when it opens.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

PIN_SECONDS = 30.0
"""How long a probed entry is kept from eviction: the sender opens its session right after."""


@dataclass(frozen=True)
class KvEntry:
    chain: tuple[bytes, ...]
    tokens: int
    blob: bytes

    @property
    def key(self) -> bytes:
        return self.chain[-1]

    @property
    def size(self) -> int:
        return len(self.blob)


@dataclass
class KvStoreStats:
    hits: int = 0
    """Sessions opened on a stored entry."""
    misses: int = 0
    """Lookups that found nothing (or less than a whole chunk)."""
    reused_tokens: int = 0
    """Prompt tokens not computed again, summed over hits."""
    stored: int = 0
    evictions: int = 0
    refused: int = 0
    """Entries not kept: larger than the whole budget."""


@dataclass
class KvStore:
    budget_bytes: int
    clock: Callable[[], float] = time.monotonic
    stats: KvStoreStats = field(default_factory=KvStoreStats)
    _entries: OrderedDict[bytes, KvEntry] = field(default_factory=OrderedDict)
    _pins: dict[bytes, float] = field(default_factory=dict)
    _bytes: int = 0

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    @property
    def bytes_held(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, chain: Sequence[bytes]) -> KvEntry | None:
        """The stored entry for the longest prefix of ``chain`` (None: none held)."""
        for blocks in range(len(chain), 0, -1):
            entry = self._entries.get(chain[blocks - 1])
            if entry is not None and entry.chain == tuple(chain[:blocks]):
                return entry
        return None

    def held_blocks(self, chain: Sequence[bytes], *, pin: bool = False) -> int:
        """How many links of ``chain`` the longest held entry covers; ``pin`` leases it."""
        entry = self.longest(chain)
        if entry is None:
            return 0
        if pin:
            self._pins[entry.key] = self.clock() + PIN_SECONDS
        return len(entry.chain)

    def take(self, chain: Sequence[bytes]) -> KvEntry | None:
        """The entry for exactly ``chain``, for a session about to reuse it (counted as a hit or
        a miss); it becomes the most recently used."""
        key = chain[-1] if chain else None
        entry = None if key is None else self._entries.get(key)
        if entry is None or entry.chain != tuple(chain):
            self.stats.misses += 1
            return None
        self._entries.move_to_end(entry.key)
        self._pins.pop(entry.key, None)
        self.stats.hits += 1
        self.stats.reused_tokens += entry.tokens
        return entry

    def miss(self) -> None:
        """A session opened with nothing to reuse."""
        self.stats.misses += 1

    def put(self, entry: KvEntry) -> bool:
        """Keep ``entry`` (replacing one of the same chain), evicting the least recently used
        unpinned entries to stay within the budget; False when it cannot fit at all."""
        if not entry.chain or entry.size > self.budget_bytes:
            self.stats.refused += 1
            return False
        self._drop(entry.key)
        now = self.clock()
        for key in list(self._entries):
            if self._bytes + entry.size <= self.budget_bytes:
                break
            if self._pins.get(key, 0.0) > now:
                continue
            self._drop(key)
            self.stats.evictions += 1
        if self._bytes + entry.size > self.budget_bytes:
            self.stats.refused += 1  # every other entry is leased to a session about to open
            return False
        self._entries[entry.key] = entry
        self._bytes += entry.size
        self.stats.stored += 1
        return True

    def tips(self, limit: int) -> list[tuple[bytes, int]]:
        """The keys and lengths (in blocks) of the ``limit`` most recently used entries: what
        this shard announces, so routes can prefer it for prompts it holds a prefix of."""
        recent = list(reversed(self._entries.values()))[:limit]
        return [(entry.key, len(entry.chain)) for entry in recent]

    def _drop(self, key: bytes) -> None:
        entry = self._entries.pop(key, None)
        self._pins.pop(key, None)
        if entry is not None:
            self._bytes -= entry.size
