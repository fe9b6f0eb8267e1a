"""Replicas' membership exchange (``tracker.etcd.membership``) against a real etcd, with
clocks the test moves: a node registered and heard at one replica is live at the other; a node
heard by nobody expires everywhere; a dead replica's nodes get a full window to move; the epoch
quarantines and revocations follow the replica that changed them."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from etcd_harness import needs_etcd
from manual_clock import ManualClock
from tracker_samples import MODEL, N_LAYERS, registration

from meshnet.core.errors import FailedPrecondition, InvalidArgument, StorageUnavailable
from meshnet.core.ids import NodeId, SessionId
from meshnet.core.tracking import NodeLoad, RouteQuery, SessionTokens
from meshnet.deploy.etcd_cluster import EtcdCluster, etcd_cluster, free_port
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.etcd.client import EtcdClient, parse_endpoints
from meshnet.tracker.etcd.counts import COUNTS_PREFIX, SharedCounts
from meshnet.tracker.etcd.membership import HEARD_PREFIX, NODES_PREFIX, SharedMembership
from meshnet.tracker.etcd.revocations import apply_revoked, exchange_revoked
from meshnet.tracker.etcd.store import EPOCH_KEY, EtcdTrackerStore
from meshnet.tracker.registry import NodeRegistry
from meshnet.tracker.revocation_feed import RevocationFeed
from meshnet.tracker.stores import replica_id
from meshnet.tracker.swarm_service import TrackerSecurity, load_tracker_security

pytestmark = needs_etcd

INTERVAL_S = 2.0  # expiry after 3 intervals: 6 s of the test's clock
NODE = NodeId("n-1")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    with etcd_cluster(tmp_path, size=1) as started:
        yield started


def replica(cluster: EtcdCluster, name: str, clock: ManualClock) -> SharedMembership:
    registry = NodeRegistry(clock=clock, heartbeat_interval_s=INTERVAL_S)
    return SharedMembership(EtcdClient(parse_endpoints(cluster.store)), registry, name, INTERVAL_S)


async def advance(clock: ManualClock, seconds: float, *replicas: SharedMembership) -> None:
    """Let ``seconds`` pass in steps of one interval, every replica exchanging and sweeping (as
    the tracker's sweeper does) at each."""
    for _ in range(round(seconds / INTERVAL_S)):
        clock.now += INTERVAL_S
        for each in replicas:
            await each.exchange()
            each.registry.sweep()


async def heard_at_a(cluster: EtcdCluster, clock: ManualClock) -> tuple[SharedMembership, SharedMembership]:
    """Replicas a and b after one exchange each, ``NODE`` registered and heard at a."""
    a, b = replica(cluster, "a", clock), replica(cluster, "b", clock)
    a.registry.register(registration(0, 20), NODE)
    a.registry.heartbeat(NODE, NodeLoad())
    await advance(clock, INTERVAL_S, a, b)
    return a, b


async def test_a_node_heard_at_one_replica_is_live_at_the_other_until_nobody_hears_it(cluster: EtcdCluster) -> None:
    clock = ManualClock(1000.0)
    a, b = replica(cluster, "a", clock), replica(cluster, "b", clock)
    a.registry.register(registration(0, 20), NODE)
    for _ in range(5):  # 10 s: past the 6 s expiry, heard at a every interval
        a.registry.heartbeat(NODE, NodeLoad(free_sessions=3))
        await advance(clock, INTERVAL_S, a, b)
    entry = b.registry.get(NODE)
    assert entry is not None and entry.load == NodeLoad(free_sessions=3)
    # Nobody hears it any more: gone from both within one window (and a changed the epoch).
    await advance(clock, 4 * INTERVAL_S, a, b)
    assert a.registry.get(NODE) is None and b.registry.get(NODE) is None


async def test_a_dead_replicas_nodes_get_a_full_window_to_move(cluster: EtcdCluster) -> None:
    clock = ManualClock(1000.0)
    a, b = await heard_at_a(cluster, clock)
    await advance(clock, INTERVAL_S, b)
    assert b.registry.get(NODE) is not None
    # a dies (its lease's keys vanish), unnoticed for most of a window: b has not heard the node
    # for 4 s of its 6 s when it finds a's digest gone...
    a.client.delete(HEARD_PREFIX + "a")
    clock.now += 2 * INTERVAL_S - 0.5
    await b.exchange()
    # ...and still gives it a whole window from then: the node heartbeats b 5.9 s later.
    clock.now += 3 * INTERVAL_S - 0.1
    b.registry.sweep()
    assert b.registry.heartbeat(NODE, NodeLoad()) is True


async def test_the_epoch_and_quarantines_follow_the_replica_that_changed_them(cluster: EtcdCluster) -> None:
    clock = ManualClock(1000.0)
    a, b = replica(cluster, "a", clock), replica(cluster, "b", clock)
    store_a = EtcdTrackerStore(a.client)
    b.registry.register(registration(0, 20), NODE)
    await advance(clock, INTERVAL_S, a, b)
    store_a.save_epoch(41)
    store_a.quarantine_node(NODE, "disagreed in an audit", None, at=5.0)
    await advance(clock, INTERVAL_S, b)
    assert b.registry.epoch >= 41
    assert NODE in b.registry.quarantined and b.registry.get(NODE) is None
    store_a.clear_quarantine(NODE)
    await advance(clock, INTERVAL_S, b)
    assert NODE not in b.registry.quarantined


async def test_a_node_registered_again_elsewhere_is_routed_with_its_new_record(cluster: EtcdCluster) -> None:
    clock = ManualClock(1000.0)
    a, b = await heard_at_a(cluster, clock)
    first = b.registry.get(NODE)
    assert first is not None and first.record == registration(0, 20)
    a.registry.register(registration(0, 10), NODE)  # restarted with fewer layers
    a.registry.heartbeat(NODE, NodeLoad())
    await advance(clock, INTERVAL_S, a, b)
    again = b.registry.get(NODE)
    assert again is not None and again.record == registration(0, 10)


async def test_a_replica_follows_an_epoch_raised_elsewhere_without_waiting_for_an_exchange(
    cluster: EtcdCluster,
) -> None:
    clock = ManualClock(1000.0)
    b = replica(cluster, "b", clock)
    b.interval_s = 3600.0  # one exchange at start, then none during the test: only the watch moves it
    running = asyncio.create_task(b.run_forever())
    try:
        assert await asyncio.to_thread(b.watching.wait, 30)  # the watch stream is open
        EtcdTrackerStore(EtcdClient(parse_endpoints(cluster.store))).save_epoch(77)
        for _ in range(100):
            if b.registry.epoch == 77:
                break
            await asyncio.sleep(0.05)
        assert b.registry.epoch == 77
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


def test_a_quiet_epoch_watch_hears_progress_from_its_member(tmp_path: Path) -> None:
    """No epoch is written, yet the member says the watch is alive and current through a newer
    revision: a live quiet stream is told from a dead one without waiting out its idle timeout."""
    with etcd_cluster(tmp_path, size=1, progress_notify_s=0.5) as quiet:
        client = EtcdClient(parse_endpoints(quiet.store))
        values: list[bytes] = []
        progress: list[int] = []
        opened, stopped = threading.Event(), threading.Event()
        arguments = (EPOCH_KEY, values.append, stopped, opened, progress.append)
        threading.Thread(target=client.follow, args=arguments, daemon=True).start()
        try:
            assert opened.wait(30)
            revision = client.put(NODES_PREFIX + "elsewhere", b"x")  # another key: no event here
            deadline = time.monotonic() + 30
            while not (progress and progress[-1] >= revision) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert progress and progress[-1] >= revision
            assert values == []
        finally:
            stopped.set()


def test_a_revocation_at_one_replica_reaches_the_book_of_another(cluster: EtcdCluster, tmp_path: Path) -> None:
    # Two machines' copies of one swarm dir: the same CA, books that start equal.
    load_tracker_security(tmp_path / "a", time.time())
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    a, b = load_tracker_security(tmp_path / "a", time.time()), load_tracker_security(tmp_path / "b", time.time())
    client = EtcdClient(parse_endpoints(cluster.store))
    a.book.revoke("stolen-laptop", time.time())
    exchange_revoked(client, a.book.revoked())
    feed = RevocationFeed(b.link.revocations)
    apply_revoked(b, feed, exchange_revoked(client, b.book.revoked()))
    assert "stolen-laptop" in b.book.revoked()
    assert "stolen-laptop" in b.link.revocations.current()  # refused at b's port from now on


async def test_malformed_keys_in_etcd_are_skipped_not_fatal(cluster: EtcdCluster) -> None:
    clock = ManualClock(1000.0)
    a, b = await heard_at_a(cluster, clock)
    for key, value in (
        (HEARD_PREFIX + "x", b"not json"),
        (HEARD_PREFIX + "y", b'{"n-2": "bm90IGEgcHJvdG8="}'),
        (NODES_PREFIX + "n-3", b"{}"),
        (HEARD_PREFIX + "z", b'{"n-3": ""}'),
        (COUNTS_PREFIX + "x/1", b'{"node": "n-1", "sessions": [["s", -1, 0, 0]]}'),
    ):
        b.client.put(key, value)
    b.counts = SharedCounts(b.client, "b")
    a.registry.heartbeat(NODE, NodeLoad())
    await advance(clock, INTERVAL_S, a, b)  # raises nothing
    assert b.registry.get(NODE) is not None and b.registry.get(NodeId("n-3")) is None


async def test_a_node_that_moved_and_registered_again_is_taken_back_with_its_new_record(cluster: EtcdCluster) -> None:
    clock = ManualClock(1000.0)
    a, b = await heard_at_a(cluster, clock)
    clock.now += 0.1  # (a heartbeat counted at the very instant of a local one would hide it)
    b.registry.register(registration(0, 10), NODE)  # it moved to b and registered there again
    b.registry.heartbeat(NODE, NodeLoad())
    await advance(clock, INTERVAL_S, b, a)
    at_a = a.registry.get(NODE)
    assert at_a is not None and at_a.record == registration(0, 10)
    # and a, which took it from b, does not announce its old record again
    await advance(clock, INTERVAL_S, a, b)
    at_b = b.registry.get(NODE)
    assert at_b is not None and at_b.record == registration(0, 10)


async def test_a_node_nobody_hears_is_withdrawn_from_etcd(cluster: EtcdCluster) -> None:
    clock = ManualClock(1000.0)
    a, b = await heard_at_a(cluster, clock)
    assert a.client.get(NODES_PREFIX + NODE) is not None
    await advance(clock, 5 * INTERVAL_S, a, b)
    assert a.registry.get(NODE) is None and b.registry.get(NODE) is None
    assert a.client.get(NODES_PREFIX + NODE) is None


async def test_a_bad_stored_epoch_does_not_stop_the_exchange(cluster: EtcdCluster) -> None:
    clock = ManualClock(1000.0)
    a, b = replica(cluster, "a", clock), replica(cluster, "b", clock)
    b.client.put(EPOCH_KEY, b"not-a-number")
    a.registry.register(registration(0, 20), NODE)
    a.registry.heartbeat(NODE, NodeLoad())
    await advance(clock, INTERVAL_S, a, b)  # raises nothing
    assert b.registry.get(NODE) is not None


async def test_a_failed_exchange_announces_its_nodes_at_the_next(cluster: EtcdCluster) -> None:
    clock = ManualClock(1000.0)
    a = replica(cluster, "a", clock)
    reachable = a.client
    a.client = EtcdClient((f"http://127.0.0.1:{free_port()}",), timeout_s=0.5)  # etcd out of reach
    a.registry.register(registration(0, 20), NODE)
    with pytest.raises(StorageUnavailable):
        await a.exchange()
    a.client = reachable
    await a.exchange()
    assert a.client.get(NODES_PREFIX + NODE) is not None


async def test_a_node_that_left_one_replica_keeps_its_key_while_another_hears_it(cluster: EtcdCluster) -> None:
    clock = ManualClock(1000.0)
    a, b = await heard_at_a(cluster, clock)
    # The node heartbeats b now; a loses it (it expired it while cut off from etcd).
    clock.now += 0.1
    b.registry.heartbeat(NODE, NodeLoad())
    await b.exchange()
    a.registry.deregister(NODE)
    await a.exchange()
    assert a.client.get(NODES_PREFIX + NODE) is not None
    # so a replica started now can still take it
    c = replica(cluster, "c", clock)
    await c.exchange()
    assert c.registry.get(NODE) is not None


async def test_a_deregistration_reaches_the_replica_that_adopted_the_node(cluster: EtcdCluster) -> None:
    clock = ManualClock(1000.0)
    a, b = await heard_at_a(cluster, clock)
    assert b.registry.get(NODE) is not None
    a.registry.deregister(NODE)  # the node said goodbye to a
    await a.exchange()
    await b.exchange()  # well within the expiry window
    assert a.client.get(NODES_PREFIX + NODE) is None and b.registry.get(NODE) is None


async def test_a_key_nobody_hears_is_withdrawn_by_any_replica_after_its_announcer_died(cluster: EtcdCluster) -> None:
    clock = ManualClock(1000.0)
    a, b = await heard_at_a(cluster, clock)
    a.client.delete(HEARD_PREFIX + "a")  # a died: only b exchanges from now on
    await advance(clock, 8 * INTERVAL_S, b)
    assert b.registry.get(NODE) is None
    await advance(clock, 8 * INTERVAL_S, b)
    assert b.client.get(NODES_PREFIX + NODE) is None


async def test_a_heard_node_whose_key_vanished_is_announced_again(cluster: EtcdCluster) -> None:
    clock = ManualClock(1000.0)
    a = replica(cluster, "a", clock)
    a.registry.register(registration(0, 20), NODE)
    a.registry.heartbeat(NODE, NodeLoad())
    await a.exchange()
    a.client.delete(NODES_PREFIX + NODE)
    a.registry.heartbeat(NODE, NodeLoad())
    await a.exchange()
    await a.exchange()
    assert a.client.get(NODES_PREFIX + NODE) is not None


def test_a_replica_id_held_by_a_live_replica_is_refused(cluster: EtcdCluster) -> None:
    clock = ManualClock(1000.0)
    replica(cluster, "a", clock).claim()
    with pytest.raises(FailedPrecondition, match="held by another live replica"):
        replica(cluster, "a", clock).claim()
    replica(cluster, "b", clock).claim()


def test_the_default_replica_id_names_the_machine_not_a_wildcard() -> None:
    assert not replica_id(TrackerConfig(host="0.0.0.0"), 7070).startswith("0.0.0.0")
    assert replica_id(TrackerConfig(host="127.0.0.1"), 7070) == "127.0.0.1:7070"
    with pytest.raises(InvalidArgument):
        replica_id(TrackerConfig(replica_id="a/b"), 7070)


async def test_etcd_history_stays_bounded_while_digests_are_rewritten(cluster: EtcdCluster) -> None:
    clock = ManualClock(1000.0)
    a = replica(cluster, "a", clock)
    a.compact_every = 5
    for index in range(300):  # a digest of ~10 kB, rewritten at every exchange
        a.registry.register(
            registration(0, 20, address=f"10.0.{index // 250}.{index % 250}:9000"), NodeId(f"n-{index}")
        )
    for _ in range(400):
        for index in range(300):
            a.registry.heartbeat(NodeId(f"n-{index}"), NodeLoad(free_sessions=index % 7))
        await a.exchange()
    in_use = int(httpx.post(cluster.members[0].client_url + "/v3/maintenance/status", json={}).json()["dbSizeInUse"])
    # Measured: ~0.5 MB compacted every 5 exchanges; ~4 MB uncompacted (every digest version kept).
    assert in_use < 1_500_000


async def test_replicas_moving_on_from_one_epoch_hand_out_different_ones(cluster: EtcdCluster) -> None:
    clock = ManualClock(1000.0)
    a, b = replica(cluster, "a", clock), replica(cluster, "b", clock)
    a.start()
    b.start()
    for each in (a, b):
        each.registry.follow_epoch(100)
        each.registry.register(registration(0, N_LAYERS), NODE)
        each.registry.deregister(NODE)  # a membership change: each moves on from 100
    assert a.registry.epoch > 100 and b.registry.epoch > 100 and a.registry.epoch != b.registry.epoch


async def test_a_session_new_at_a_replica_gets_an_epoch_of_its_own(cluster: EtcdCluster) -> None:
    clock = ManualClock(1000.0)
    b = replica(cluster, "b", clock)
    b.start()
    b.registry.register(registration(0, N_LAYERS), NODE)
    b.registry.heartbeat(NODE, NodeLoad(free_sessions=4))
    before = b.registry.epoch
    # Routed by another replica at ``before`` until it died: re-routed here, it must supersede.
    route = b.registry.choose_route(RouteQuery(MODEL, SessionId("s-1")))
    assert route.epoch > before
    assert b.registry.choose_route(RouteQuery(MODEL, SessionId("s-1"))).epoch == route.epoch  # sticky


async def test_a_digest_no_longer_rewritten_stops_keeping_its_nodes_alive(cluster: EtcdCluster) -> None:
    clock = ManualClock(1000.0)
    a, b = await heard_at_a(cluster, clock)
    assert b.registry.get(NODE) is not None
    # a's digest stays in etcd (its lease kept alive) but is never rewritten: b stops counting
    # it, gives its nodes the grace of a dead replica's, then expires them.
    await advance(clock, 8 * INTERVAL_S, b)
    assert a.client.get(HEARD_PREFIX + "a") is not None
    assert b.registry.get(NODE) is None


async def test_a_digest_read_again_unchanged_does_not_reset_routes_burst_protection(cluster: EtcdCluster) -> None:
    clock = ManualClock(1000.0)
    a, b = replica(cluster, "a", clock), replica(cluster, "b", clock)
    a.registry.register(registration(0, N_LAYERS), NODE)
    a.registry.heartbeat(NODE, NodeLoad(free_sessions=3))
    await a.exchange()
    await b.exchange()
    b.registry.choose_route(RouteQuery(MODEL, SessionId("s-1")))
    await b.exchange()  # a has not written a new digest since: its loads are not news
    entry = b.registry.get(NODE)
    assert entry is not None and entry.routed_since_heartbeat == 1


def test_counts_are_published_under_a_new_lease_when_theirs_is_gone(cluster: EtcdCluster) -> None:
    client = EtcdClient(parse_endpoints(cluster.store))
    mine, other = SharedCounts(client, "a"), SharedCounts(client, "b")
    sessions = (SessionTokens(SessionId("s-1"), 3, 10, 4),)
    mine.publish(NODE, sessions)
    httpx.post(cluster.members[0].client_url + "/v3/lease/revoke", json={"ID": str(mine._lease)})
    mine.publish(NODE, sessions)  # raises nothing
    assert other.others_since_last()[0] == [(NODE, sessions)]


class LoopCheckedFeed(RevocationFeed):
    """A real feed that remembers the thread each change came from: the registry, the book and
    the watchers' asyncio.Event belong to the event loop's thread."""

    def __init__(self, security: TrackerSecurity) -> None:
        super().__init__(security.link.revocations)
        self.threads: list[int] = []

    def changed(self) -> None:
        self.threads.append(threading.get_ident())
        super().changed()


async def test_revocations_from_other_replicas_are_applied_on_the_event_loop(
    cluster: EtcdCluster, tmp_path: Path
) -> None:
    load_tracker_security(tmp_path / "a", time.time())
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    clock = ManualClock(1000.0)
    a, b = replica(cluster, "a", clock), replica(cluster, "b", clock)
    security_a, security_b = (load_tracker_security(tmp_path / name, time.time()) for name in ("a", "b"))
    feed = LoopCheckedFeed(security_b)
    a.revocations, b.revocations = (security_a, RevocationFeed(security_a.link.revocations)), (security_b, feed)
    watch = feed.updates()
    assert await anext(watch) == frozenset()
    security_a.book.revoke("stolen-laptop", time.time())
    await a.exchange()
    await b.exchange()
    assert feed.threads == [threading.get_ident()]  # this test's loop, not the exchange's I/O thread
    assert await asyncio.wait_for(anext(watch), timeout=10) == frozenset({"stolen-laptop"})
