"""Which routed experts stay resident on a node with a bounded expert cache: a byte-bounded LRU.

A key is one routed expert of one layer (its gate, up and down rows together: ``mul_mat_id``
reads all three for every selected slot). Each MoE layer, the experts the layer is about to read
are admitted at once: the ones not resident are misses (read from the model file), and the least
recently used others are evicted until the resident bytes fit the capacity again. Experts the
current layer reads are never evicted for it, so a prefill layer that selects more experts than
fit holds them all for that layer (the peak is reported) and gives them up at the next layer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from meshnet.core.errors import InvalidArgument

ExpertKey = tuple[int, int]
"""``(layer, expert)``."""


@dataclass(frozen=True)
class CacheDecision:
    """One admission: what to read from the file, and what to give back (both in order)."""

    misses: tuple[ExpertKey, ...]
    evicted: tuple[ExpertKey, ...]
    hits: int


@dataclass(frozen=True)
class CacheCounters:
    hits: int
    misses: int
    bytes_read: int
    evictions: int
    resident_bytes: int
    peak_resident_bytes: int

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class ExpertLru:
    def __init__(self, capacity_bytes: int, sizes: Mapping[ExpertKey, int]) -> None:
        if capacity_bytes <= 0:
            raise InvalidArgument(f"an expert cache needs a positive capacity, not {capacity_bytes} bytes")
        self.capacity_bytes = capacity_bytes
        self._sizes = dict(sizes)
        self._resident: OrderedDict[ExpertKey, int] = OrderedDict()
        self._bytes = 0
        self._counters = CacheCounters(0, 0, 0, 0, 0, 0)

    def admit(self, keys: Iterable[ExpertKey]) -> CacheDecision:
        """The experts one layer reads now (duplicates allowed); updates recency and residency."""
        wanted = list(dict.fromkeys(keys))
        misses, hits = [], 0
        for key in wanted:
            if key not in self._sizes:
                raise InvalidArgument(f"expert {key[1]} of layer {key[0]} is not a routed expert of this model")
            if key in self._resident:
                hits += 1
                self._resident.move_to_end(key)
            else:
                misses.append(key)
                self._resident[key] = self._sizes[key]
                self._bytes += self._sizes[key]
        protected = set(wanted)
        evicted = []
        for key in list(self._resident):
            if self._bytes <= self.capacity_bytes:
                break
            if key not in protected:
                self._bytes -= self._resident.pop(key)
                evicted.append(key)
        c = self._counters
        peak = max(c.peak_resident_bytes, self._bytes)  # the engine evicts before it reads the misses
        self._counters = CacheCounters(
            c.hits + hits,
            c.misses + len(misses),
            c.bytes_read + sum(self._sizes[k] for k in misses),
            c.evictions + len(evicted),
            self._bytes,
            peak,
        )
        return CacheDecision(tuple(misses), tuple(evicted), hits)

    @property
    def resident_keys(self) -> frozenset[ExpertKey]:
        return frozenset(self._resident)

    @property
    def counters(self) -> CacheCounters:
        return self._counters
