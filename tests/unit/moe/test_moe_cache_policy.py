"""The expert cache's policy: a byte-bounded LRU over (layer, expert), admitting a layer at once."""

from __future__ import annotations

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.moe.cache_policy import ExpertLru

SIZES = {(layer, expert): 100 for layer in range(2) for expert in range(4)}


def test_misses_then_hits_and_lru_eviction() -> None:
    lru = ExpertLru(300, SIZES)
    first = lru.admit([(0, 0), (0, 1), (0, 1)])
    assert first.misses == ((0, 0), (0, 1)) and first.evicted == () and first.hits == 0
    assert lru.admit([(0, 0)]).hits == 1  # (0, 1) is now the least recently used
    second = lru.admit([(1, 2), (1, 3)])
    assert second.misses == ((1, 2), (1, 3)) and second.evicted == ((0, 1),)
    counters = lru.counters
    assert (counters.hits, counters.misses, counters.bytes_read, counters.evictions) == (1, 4, 400, 1)
    assert counters.resident_bytes == 300 and counters.peak_resident_bytes == 300
    assert counters.hit_rate == pytest.approx(1 / 5)


def test_a_layer_wider_than_the_capacity_keeps_its_experts_for_that_layer() -> None:
    lru = ExpertLru(150, SIZES)
    wide = lru.admit([(0, e) for e in range(4)])
    assert wide.evicted == () and lru.counters.peak_resident_bytes == 400
    narrow = lru.admit([(1, 0)])
    assert narrow.evicted == ((0, 0), (0, 1), (0, 2), (0, 3)) and lru.counters.resident_bytes == 100


def test_refusals() -> None:
    with pytest.raises(InvalidArgument):
        ExpertLru(0, SIZES)
    with pytest.raises(InvalidArgument):
        ExpertLru(100, SIZES).admit([(5, 0)])
