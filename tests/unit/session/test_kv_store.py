"""The shard's reuse store: longest match, byte budget, LRU order, leases, counters."""

from __future__ import annotations

from manual_clock import ManualClock

from meshnet.session.kv_store import PIN_SECONDS, KvEntry, KvStore


def _link(n: int) -> bytes:
    return n.to_bytes(16, "big")


def _entry(*links: int, size: int = 100) -> KvEntry:
    return KvEntry(tuple(_link(n) for n in links), 64 * len(links), b"x" * size)


def test_the_longest_held_prefix_of_a_chain_is_found() -> None:
    store = KvStore(10_000)
    store.put(_entry(1))
    store.put(_entry(1, 2, 3))
    assert store.held_blocks([_link(n) for n in (1, 2, 3, 4)]) == 3
    assert store.held_blocks([_link(n) for n in (1, 2, 9)]) == 1
    assert store.held_blocks([_link(5)]) == 0
    # A key is a chain's last link: an entry whose chain differs before it is not a match
    # (it replaced the one of the same key: links are hashes of whole prefixes, never shared).
    store.put(KvEntry((_link(7), _link(3)), 128, b"y"))
    assert store.longest([_link(1), _link(2), _link(3)]) == _entry(1)


def test_the_budget_is_never_exceeded_and_the_least_recently_used_goes_first() -> None:
    store = KvStore(250)
    store.put(_entry(1))
    store.put(_entry(2))
    assert store.take([_link(1)]) is not None  # 1 is now the most recently used
    store.put(_entry(3))
    assert store.bytes_held == 200 <= store.budget_bytes
    assert store.held_blocks([_link(2)]) == 0 and store.held_blocks([_link(1)]) == 1
    assert store.stats.evictions == 1
    assert not store.put(_entry(4, size=251)) and store.stats.refused == 1


def test_a_probed_entry_is_leased_until_its_session_opens_or_the_lease_ends() -> None:
    clock = ManualClock()
    store = KvStore(200, clock=clock)
    store.put(_entry(1))
    store.put(_entry(2))
    assert store.held_blocks([_link(1)], pin=True) == 1
    store.put(_entry(3))
    assert store.held_blocks([_link(1)]) == 1, "a leased entry was evicted"
    assert store.held_blocks([_link(2)]) == 0
    clock.now = PIN_SECONDS + 1
    store.put(_entry(4))
    store.put(_entry(5))
    assert store.held_blocks([_link(1)]) == 0


def test_hits_misses_and_reused_positions_are_counted() -> None:
    store = KvStore(1000)
    store.put(_entry(1, 2))
    assert store.take([_link(1), _link(2)]) is not None
    assert store.take([_link(1)]) is None
    store.miss()
    assert (store.stats.hits, store.stats.misses, store.stats.reused_tokens) == (1, 2, 128)
    assert store.tips(5) == [(_link(2), 2)]
    assert not KvStore(0).enabled
