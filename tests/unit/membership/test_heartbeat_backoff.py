"""The heartbeat loop's waits: a forgotten node rejoins after a jittered fraction of an interval,
a shed one after the tracker's hint jittered, never at once.

The tracker here is a scripted fake (it answers what the test lists, in order) and the loop's
pause is a recorder, so the schedule is read exactly, with no clock; what it cannot show is a
real tracker's answers, which ``tests/integration/test_tracker_replicas.py`` covers."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace
from typing import Any, cast

from meshnet.core.errors import TrackerBusy, Unreachable
from meshnet.core.ids import NodeId
from meshnet.core.node_record import NodeRecord
from meshnet.core.tracking import HeartbeatStatus, NodeLoad, Registered
from meshnet.membership.backoff import BusyBackoff, RejoinDelay
from meshnet.membership.heartbeats import heartbeat_loop
from meshnet.membership.tracker_client import TrackerClient

NODE = NodeId("node-1")
INTERVAL_S = 2.0
SEED = 36


class ScriptedTracker:
    """Answers each call with the next item of ``script``: a value to return or an error to raise."""

    address = "127.0.0.1:7070"

    def __init__(self, script: list[object]) -> None:
        self.script = script
        self.calls: list[str] = []

    async def register(self, record: object, node_id: NodeId, **_: Any) -> Registered:
        return self._next("register")  # type: ignore[return-value]

    async def heartbeat(self, node_id: NodeId, load: NodeLoad, **_: Any) -> HeartbeatStatus:
        return self._next("heartbeat")  # type: ignore[return-value]

    async def deregister(self, node_id: NodeId, **_: Any) -> bool:
        self.calls.append("deregister")
        return True

    def _next(self, call: str) -> object:
        self.calls.append(call)
        answer = self.script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


async def run(script: list[object], seed: int = SEED) -> tuple[list[float], list[str]]:
    """The loop's pauses until the script is spent, and the calls it made (jitter from ``seed``)."""
    tracker = ScriptedTracker(script)
    stop = asyncio.Event()
    pauses: list[float] = []

    async def record(stop_event: asyncio.Event, changed: asyncio.Event | None, timeout_s: float) -> None:
        pauses.append(timeout_s)
        if not tracker.script:
            stop_event.set()

    await heartbeat_loop(
        cast(TrackerClient, tracker),
        NODE,
        cast(NodeRecord, SimpleNamespace(address="127.0.0.1:7001")),
        NodeLoad,
        stop,
        draw=random.Random(seed).random,
        pause=record,
    )
    return pauses, tracker.calls


def draws(count: int) -> list[float]:
    source = random.Random(SEED)
    return [source.random() for _ in range(count)]


REGISTERED = Registered(NODE, INTERVAL_S, epoch=1)
KNOWN = HeartbeatStatus(True, 1)
FORGOTTEN = HeartbeatStatus(False, 1)


async def test_a_forgotten_node_registers_after_a_jittered_fraction_of_an_interval() -> None:
    pauses, calls = await run([REGISTERED, KNOWN, FORGOTTEN, REGISTERED])
    (draw,) = draws(1)
    assert pauses == [INTERVAL_S, INTERVAL_S, RejoinDelay().wait_s(INTERVAL_S, lambda: draw), INTERVAL_S]
    assert 0 <= pauses[2] < INTERVAL_S
    assert calls == ["register", "heartbeat", "heartbeat", "register", "deregister"]


async def test_a_shed_heartbeat_waits_the_hint_jittered() -> None:
    pauses, _ = await run([REGISTERED, TrackerBusy("shedding", 3.0), KNOWN])
    (draw,) = draws(1)
    assert pauses == [INTERVAL_S, BusyBackoff().wait_s(3.0, lambda: draw), INTERVAL_S]
    assert 1.5 <= pauses[1] <= 4.5


async def test_a_shed_registration_waits_the_hint_too_and_is_asked_again() -> None:
    pauses, calls = await run([TrackerBusy("shedding", 0.8), REGISTERED])
    assert 0.4 <= pauses[0] <= 1.2
    assert calls[:2] == ["register", "register"]


async def test_nodes_forgotten_together_rejoin_at_different_times() -> None:
    """100 loops (one seed each, as each process has its own) forgotten in the same beat: each
    pauses its own fraction of an interval before registering again, so they spread out."""
    rejoin_pauses = []
    for node in range(100):
        pauses, calls = await run([REGISTERED, FORGOTTEN, REGISTERED], seed=SEED * 1000 + node)
        assert calls[:3] == ["register", "heartbeat", "register"]
        rejoin_pauses.append(pauses[1])
    assert all(0 <= pause < INTERVAL_S for pause in rejoin_pauses)
    assert len({round(pause, 3) for pause in rejoin_pauses}) > 90
    assert max(rejoin_pauses) - min(rejoin_pauses) > INTERVAL_S / 2  # over the interval, not a clump


async def test_an_unreachable_tracker_is_asked_again_at_the_next_beat() -> None:
    pauses, calls = await run([REGISTERED, Unreachable("gone"), KNOWN])
    assert pauses == [INTERVAL_S, INTERVAL_S, INTERVAL_S]
    assert calls[:3] == ["register", "heartbeat", "heartbeat"]
