"""Expiry judged against when the tracker could last have heard a node (issue 36), fake clock.

A tracker that stalls (its loop blocked, or so far behind that heartbeats wait in its queue)
must not expire nodes for its own lateness; a node that is really silent still expires, after
a full window of the time the tracker was listening.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import cast

import grpc
import pytest
from manual_clock import ManualClock
from tracker_samples import MODEL, registration

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId, SessionId
from meshnet.core.tracking import NodeLoad, RouteQuery
from meshnet.tracker.liveness import Deadlines, Hearing
from meshnet.tracker.registry import NodeRegistry
from meshnet.tracker.service import TrackerServicer
from meshnet.tracker.store import TrackerStore
from meshnet.tracker.store_runner import StoreRunner
from meshnet.wire import tracker_wire

INTERVAL = 2.0
WINDOW = 3 * INTERVAL
TICK = 0.5  # the sweep task's period: the loop's watcher


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1000.0)


@pytest.fixture
def registry(clock: ManualClock) -> NodeRegistry:
    return NodeRegistry(clock=clock, heartbeat_interval_s=INTERVAL)


def watch(registry: NodeRegistry, clock: ManualClock, seconds: float) -> None:
    """Run the healthy sweep task for ``seconds``: it wakes on time every TICK and sweeps."""
    for _ in range(int(seconds / TICK)):
        registry.hearing.expect(clock.now + TICK)
        clock.now += TICK
        assert registry.hearing.woke() == 0.0
        registry.sweep()


def join(registry: NodeRegistry, name: str, port: int) -> NodeId:
    return registry.register(registration(0, 20, address=f"h:{port}"), NodeId(name))


def test_a_stall_longer_than_the_window_expires_no_node_that_heartbeated_on_time(
    registry: NodeRegistry, clock: ManualClock
) -> None:
    nodes = [join(registry, f"n{i}", i) for i in range(4)]
    watch(registry, clock, 1.0)
    registry.hearing.expect(clock.now + TICK)
    clock.now += 30.0  # the loop is blocked for five windows; every node's heartbeats queue up
    # The first callbacks to run are queued handlers, before the watcher reports the stall.
    assert registry.heartbeat(nodes[0], NodeLoad(free_sessions=1))
    assert registry.sweep() == ()
    assert registry.hearing.woke() == 30.0 - TICK
    for node_id in nodes[1:]:  # the other queued heartbeats, read late
        assert registry.heartbeat(node_id, NodeLoad(free_sessions=1))
    assert {entry.node_id for entry in registry.entries()} == set(nodes)


def test_a_silent_node_expires_after_a_full_window_of_listening_even_across_a_stall(
    registry: NodeRegistry, clock: ManualClock
) -> None:
    silent, steady = join(registry, "silent", 1), join(registry, "steady", 2)
    watch(registry, clock, 2.0)  # 2 s of the window heard in silence
    registry.hearing.expect(clock.now + TICK)
    clock.now += 20.0  # a stall: only its first TICK, before the watcher was due, is heard time
    registry.hearing.woke()
    assert registry.heartbeat(steady, NodeLoad())
    watch(registry, clock, 3.0)  # 5.5 s of listening since the silent node was heard...
    assert registry.get(silent) is not None
    registry.hearing.expect(clock.now + TICK)
    clock.now += TICK  # ...and now the whole window
    registry.hearing.woke()
    assert registry.sweep() == (silent,)
    assert registry.get(steady) is not None


def test_a_silent_node_expires_on_time_while_the_tracker_keeps_up(registry: NodeRegistry, clock: ManualClock) -> None:
    node = join(registry, "n0", 1)
    watch(registry, clock, WINDOW - TICK)
    assert registry.get(node) is not None
    watch(registry, clock, TICK)
    assert registry.get(node) is None


def test_a_heartbeat_too_busy_to_read_whole_still_counts_as_heard(registry: NodeRegistry, clock: ManualClock) -> None:
    node = join(registry, "n0", 1)
    assert registry.heartbeat(node, NodeLoad(free_sessions=3))
    watch(registry, clock, WINDOW - TICK)
    assert registry.heard(node)
    watch(registry, clock, WINDOW - TICK)
    entry = registry.get(node)
    assert entry is not None and entry.load == NodeLoad(free_sessions=3)  # its report waits
    assert not registry.heard(NodeId("stranger"))


def test_a_mass_join_while_behind_gives_every_node_a_full_window_from_when_it_was_read(
    registry: NodeRegistry, clock: ManualClock
) -> None:
    """After a restart every node registers at once; the tracker reads them late."""
    registry.hearing.expect(clock.now + TICK)
    joined = []
    for i in range(50):  # each registration read 0.25 s after the last, the watcher kept waiting
        clock.now += 0.25
        joined.append(join(registry, f"n{i}", i))
    registry.hearing.woke()
    for node_id in joined:  # their first heartbeats, also read late but read
        assert registry.heartbeat(node_id, NodeLoad())
    watch(registry, clock, WINDOW - TICK)
    assert len(registry.entries()) == 50


def test_a_stall_is_grace_for_one_window_after_it_and_is_counted_once(clock: ManualClock) -> None:
    hearing = Hearing(clock, WINDOW)
    hearing.expect(clock.now + 1.0)
    clock.now += 0.5
    assert hearing.lag_s() == 0.0 and hearing.grace_s() == 0.0
    clock.now += 3.5
    assert hearing.lag_s() == 3.0 and hearing.grace_s() == 3.0  # counts while still stalled
    assert hearing.woke() == 3.0
    assert hearing.grace_s() == 3.0 and hearing.recent_lag_s() == 3.0  # a busy loop stays busy
    hearing.expect(clock.now - 1.0)  # a watcher due before the stall was reported: not twice
    assert hearing.woke() == 0.0 and hearing.grace_s() == 3.0
    clock.now += WINDOW - 0.01
    assert hearing.grace_s() == 3.0
    clock.now += 0.01  # the window after the stall is over: its heartbeats had their time
    assert hearing.grace_s() == 0.0


def test_a_tracker_late_every_cycle_still_expires_a_dead_node_within_two_windows(
    registry: NodeRegistry, clock: ManualClock
) -> None:
    """Review item 5: deafness counts for one window only, so sustained lateness is bounded."""
    dead = join(registry, "dead", 1)
    late = 2.0  # every sweep cycle runs 2 s late (a listening clock would stretch 6 s to 30 s)
    while registry.get(dead) is not None:
        registry.hearing.expect(clock.now + TICK)
        clock.now += TICK + late
        registry.hearing.woke()
        registry.sweep()
        assert clock.now - 1000.0 < 2 * WINDOW + late + TICK
    assert clock.now - 1000.0 >= WINDOW + late


def test_time_while_strained_is_grace_at_most_one_window(registry: NodeRegistry, clock: ManualClock) -> None:
    """Review item 3: calls queued in gRPC are invisible to the watcher, so time while admission
    sheds registrations (or the store is behind) counts as deaf, at most one window."""
    node = join(registry, "n0", 1)
    watch(registry, clock, 1.0)
    registry.hearing.strain("admission", True)
    watch(registry, clock, WINDOW)  # heartbeats wait in gRPC's queue; the loop is punctual
    assert registry.get(node) is not None
    registry.hearing.strain("admission", False)
    assert registry.hearing.grace_s() == WINDOW
    watch(registry, clock, WINDOW - 1.0 - TICK)  # a whole window of listening, less a TICK...
    assert registry.get(node) is not None
    watch(registry, clock, TICK)
    assert registry.get(node) is None  # ...and a node silent all along expires
    registry.hearing.strain("store", True)
    clock.now += 10 * WINDOW
    assert registry.hearing.grace_s() == WINDOW  # never more than one window, however long


def test_a_node_mid_registration_is_not_expired_until_it_is_told(registry: NodeRegistry, clock: ManualClock) -> None:
    """Review item 4: a slow store between register and the reply does not expire the node."""
    node = registry.register(registration(0, 20, address="h:1"), NodeId("slow"), pending=True)
    watch(registry, clock, 3 * WINDOW)
    assert registry.get(node) is not None
    assert registry.heard(node)  # the reply goes out: its window starts now
    watch(registry, clock, WINDOW - TICK)
    assert registry.get(node) is not None
    watch(registry, clock, TICK)
    assert registry.get(node) is None


def test_deadlines_refuse_a_nonsense_window() -> None:
    with pytest.raises(InvalidArgument):
        Deadlines(0.0)


async def test_a_stall_while_the_sweeper_awaits_persist_is_still_watched(
    registry: NodeRegistry, clock: ManualClock
) -> None:
    """Review item 1: the watcher is its own task, so a stall while the sweep waits on the store
    is still the tracker's lateness, and the first heartbeat read after it expires nobody."""
    first, second = join(registry, "first", 1), join(registry, "second", 2)
    servicer = TrackerServicer(registry, cast(StoreRunner, None), clock)
    write_done = asyncio.Event()

    async def hanging_write() -> None:  # the store's epoch write, on a disk that hangs
        await write_done.wait()

    servicer.persist_epoch = hanging_write  # type: ignore[method-assign]
    sleepers: list[tuple[float, asyncio.Future[None]]] = []

    async def sleep(seconds: float) -> None:  # asyncio.sleep on the fake clock
        woken = asyncio.get_running_loop().create_future()
        sleepers.append((clock.now + seconds, woken))
        await woken

    async def settle() -> None:
        for _ in range(10):
            await asyncio.sleep(0)

    sweeper = asyncio.ensure_future(servicer.sweep_forever(TICK, sleep))
    try:
        await settle()
        clock.now += TICK  # one on-time cycle: the watcher and the sweeper wake
        for due, woken in list(sleepers):
            if due <= clock.now:
                sleepers.remove((due, woken))
                woken.set_result(None)
        await settle()  # the sweeper now waits on the hanging write; the watcher sleeps again
        assert registry.hearing.expected_at == clock.now + TICK
        clock.now += 10.0  # the loop stalls for longer than the window
        assert registry.hearing.lag_s() == 10.0 - TICK
        assert registry.heartbeat(first, NodeLoad())  # its sweep expires nobody...
        assert registry.heartbeat(second, NodeLoad())  # ...so the other's queued heartbeat is known
    finally:
        sweeper.cancel()
        write_done.set()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeper


class _SlowStore:
    """A store whose disk takes its time writing the table of nodes seen."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def record_node(self, *args: object) -> None:
        self.release.wait(timeout=30)

    def save_epoch(self, epoch: int) -> None:
        pass

    def close(self) -> None:
        pass


async def test_a_registration_waiting_on_a_slow_store_starts_its_window_when_answered(
    registry: NodeRegistry, clock: ManualClock
) -> None:
    """Review item 4, through the Register handler: the store write outlasts the window, the
    tracker keeps up meanwhile, and the node is neither expired nor told it is registered late."""
    store = _SlowStore()
    runner = StoreRunner(cast(TrackerStore, store))
    servicer = TrackerServicer(registry, runner, clock)
    request = tracker_wire.registration_to_proto(registration(0, 20, address="127.0.0.1:9001"), NodeId("slow"))
    try:
        reply = asyncio.ensure_future(servicer.Register(request, cast(grpc.aio.ServicerContext, None)))
        while registry.get(NodeId("slow")) is None:
            await asyncio.sleep(0.001)
        watch(registry, clock, 3 * WINDOW)  # the tracker on time, the store not
        assert registry.get(NodeId("slow")) is not None
        store.release.set()
        assert tracker_wire.registered_from_proto(await reply).node_id == NodeId("slow")
        watch(registry, clock, WINDOW - TICK)
        assert registry.get(NodeId("slow")) is not None
        watch(registry, clock, TICK)
        assert registry.get(NodeId("slow")) is None  # silent since its reply: a window later
    finally:
        store.release.set()
        runner.close()


def test_a_session_whose_node_expired_is_still_a_live_session_for_a_while(
    registry: NodeRegistry, clock: ManualClock
) -> None:
    """Review item 10: its route is gone with the node, but the session comes back at once for a
    new one, and admission must not shed that as a new session."""
    node = join(registry, "n0", 1)
    session = SessionId("s1")
    registry.choose_route(RouteQuery(MODEL, session_id=session))
    assert registry.holds_session(session) and not registry.holds_session(SessionId("never-routed"))
    assert registry.deregister(node)
    assert registry.holds_session(session)
    clock.now += 120.0  # long after: a session nobody came back for is forgotten
    registry.sweep()
    assert not registry.holds_session(session)


def test_a_heartbeat_read_after_its_window_keeps_its_sender_rather_than_expiring_it(
    registry: NodeRegistry, clock: ManualClock
) -> None:
    # The beat arrives a moment past the window, before the sweep task's next tick: it is the
    # proof of life the window waited for. Sweeping before recording it expired its own sender
    # (known=False, a registration again: a storm when many beats are read late).
    node = join(registry, "n0", 1)
    watch(registry, clock, WINDOW - TICK)
    registry.hearing.expect(clock.now + 2 * TICK)  # the sweep task is not late: no stall
    clock.now += TICK + 0.25
    assert registry.heartbeat(node, NodeLoad(free_sessions=1))
    assert [entry.node_id for entry in registry.entries()] == [node]
    watch(registry, clock, WINDOW - TICK)  # and its window started again at that beat
    assert [entry.node_id for entry in registry.entries()] == [node]
