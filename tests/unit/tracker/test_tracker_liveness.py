"""Expiry judged against when the tracker could last have heard a node (issue 36), fake clock.

A tracker that stalls (its loop blocked, or so far behind that heartbeats wait in its queue)
must not expire nodes for its own lateness; a node that is really silent still expires, after
a full window of the time the tracker was listening.
"""

from __future__ import annotations

import pytest
from tracker_samples import FakeClock, registration

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId
from meshnet.core.tracking import NodeLoad
from meshnet.tracker.liveness import Deadlines, Hearing
from meshnet.tracker.registry import NodeRegistry

INTERVAL = 2.0
WINDOW = 3 * INTERVAL
TICK = 0.5  # the sweep task's period: the loop's watcher


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry(clock: FakeClock) -> NodeRegistry:
    return NodeRegistry(clock=clock, heartbeat_interval_s=INTERVAL)


def watch(registry: NodeRegistry, clock: FakeClock, seconds: float) -> None:
    """Run the healthy sweep task for ``seconds``: it wakes on time every TICK and sweeps."""
    for _ in range(int(seconds / TICK)):
        registry.hearing.expect(clock.now + TICK)
        clock.now += TICK
        assert registry.hearing.woke() == 0.0
        registry.sweep()


def join(registry: NodeRegistry, name: str, port: int) -> NodeId:
    return registry.register(registration(0, 20, address=f"h:{port}"), NodeId(name))


def test_a_stall_longer_than_the_window_expires_no_node_that_heartbeated_on_time(
    registry: NodeRegistry, clock: FakeClock
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
    registry: NodeRegistry, clock: FakeClock
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


def test_a_silent_node_expires_on_time_while_the_tracker_keeps_up(registry: NodeRegistry, clock: FakeClock) -> None:
    node = join(registry, "n0", 1)
    watch(registry, clock, WINDOW - TICK)
    assert registry.get(node) is not None
    watch(registry, clock, TICK)
    assert registry.get(node) is None


def test_a_heartbeat_too_busy_to_read_whole_still_counts_as_heard(registry: NodeRegistry, clock: FakeClock) -> None:
    node = join(registry, "n0", 1)
    assert registry.heartbeat(node, NodeLoad(free_sessions=3))
    watch(registry, clock, WINDOW - TICK)
    assert registry.heard(node)
    watch(registry, clock, WINDOW - TICK)
    entry = registry.get(node)
    assert entry is not None and entry.load == NodeLoad(free_sessions=3)  # its report waits
    assert not registry.heard(NodeId("stranger"))


def test_a_mass_join_while_behind_gives_every_node_a_full_window_from_when_it_was_read(
    registry: NodeRegistry, clock: FakeClock
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


def test_the_listening_clock_never_goes_back_and_counts_a_stall_once(clock: FakeClock) -> None:
    hearing = Hearing(clock)
    hearing.expect(clock.now + 1.0)
    clock.now += 0.5
    assert hearing.lag_s() == 0.0 and hearing.listening_now() == 1000.5
    clock.now += 3.5
    assert hearing.lag_s() == 3.0 and hearing.listening_now() == 1001.0  # stands still while stalled
    assert hearing.woke() == 3.0
    assert hearing.deaf_s() == 3.0 and hearing.listening_now() == 1001.0
    assert hearing.recent_lag_s() == 3.0  # a busy loop stays busy just after its watcher ran
    clock.now += 1.0
    assert hearing.listening_now() == 1002.0 and hearing.deaf_s() == 3.0


def test_deadlines_refuse_a_nonsense_window() -> None:
    with pytest.raises(InvalidArgument):
        Deadlines(0.0)


def test_a_heartbeat_read_after_its_window_keeps_its_sender_rather_than_expiring_it(
    registry: NodeRegistry, clock: FakeClock
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
