"""Graceful overload against a real tracker process (issue 36): a flood of registrations is shed
with ``TrackerBusy`` and a retry hint, while a live session's route and its node's heartbeats are
still served and the node is never expired.

The tracker runs as its own process (plaintext on loopback: this is about load, not security)
with its shipped admission limits; the flood is far more concurrent registrations than the
registration limit of calls in flight, each of which waits on the store's one writer thread.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from worker_harness import fake_record

from meshnet.core.errors import InvalidArgument, TrackerBusy
from meshnet.core.ids import NodeId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeRecord
from meshnet.core.tracking import NodeLoad, Registered
from meshnet.deploy.launch.commands import tracker_launch
from meshnet.deploy.launch.ready_lines import TrackerLine
from meshnet.membership.tracker_client import TrackerClient
from meshnet.process.launcher import child_environment
from meshnet.tracker.admission import DEFAULT_LIMITS
from meshnet.tracker.config import TrackerConfig

pytestmark = pytest.mark.timeout(120)

N_LAYERS = 8
FLOOD = 4 * DEFAULT_LIMITS.registration.in_flight
CHANNELS = 4
WAVES = 60
"""At most this many waves: the flood goes on for several expiry windows (below) anyway."""
INTERVAL = 0.5
WINDOW = 3 * INTERVAL
"""The tracker's expiry window (its default three missed heartbeats): the flood outlasts it
several times, so "the live node was never expired" could fail."""
"""The flood comes over several channels, as nodes' registrations do: gRPC itself cancels some
calls of one channel with well over 1,000 open at once (measured without admission too)."""
LIVE = NodeId("live-node")
SESSION = SessionId("live-session")


async def start_tracker_process(tmp_path: Path) -> tuple[asyncio.subprocess.Process, str]:
    config = TrackerConfig(port=0, db_path=tmp_path / "tracker.sqlite3", heartbeat_interval_s=INTERVAL, insecure=True)
    log = (tmp_path / "tracker.log").open("ab")
    launch = tracker_launch(config, tmp_path)
    process = await asyncio.create_subprocess_exec(
        *launch.argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
        env=child_environment(launch.environment),
    )
    assert process.stdout is not None
    line = (await asyncio.wait_for(process.stdout.readline(), timeout=15)).decode().rstrip("\n")
    try:
        return process, TrackerLine.read(line).address
    except InvalidArgument:
        process.kill()
        raise AssertionError(f"tracker did not start: {line!r}") from None


@dataclass
class LiveCounts:
    served: int = 0
    heartbeats: int = 0
    probes_shed: int = 0
    registrations_shed: int = 0
    heartbeats_while_shedding: int = 0
    """Heartbeats answered while a registration was shed between their call and their reply."""
    last_heartbeat: float = 0.0


async def register_one(
    client: TrackerClient, template: NodeRecord, i: int, counts: LiveCounts
) -> Registered | TrackerBusy:
    # One certified record, readdressed: certifying a fake engine per node would stall this loop.
    record = replace(template, address=f"127.0.0.1:{20000 + i}")
    try:
        return await client.register(record, NodeId(f"flood-{i}"), timeout_s=60)
    except TrackerBusy as busy:
        counts.registrations_shed += 1
        return busy


async def keep_heartbeating(client: TrackerClient, live_node: NodeId, done: asyncio.Event, counts: LiveCounts) -> None:
    """The live node's heartbeat loop, as a worker's: the next one after each reply."""
    while not done.is_set():
        shed_before = counts.registrations_shed
        status = await client.heartbeat(live_node, NodeLoad(free_sessions=4), timeout_s=10)
        assert status.known, "the live node was expired during the flood"
        counts.heartbeats += 1
        counts.last_heartbeat = time.monotonic()
        if counts.registrations_shed > shed_before:
            counts.heartbeats_while_shedding += 1
        await asyncio.sleep(0.05)


async def keep_live(
    client: TrackerClient, model: str, live_node: NodeId, done: asyncio.Event, counts: LiveCounts
) -> None:
    """Until ``done``: ask for the live session's route (each must be served), and probe for a
    route without a session (shed while the tracker is pressed, which shows the live calls ran
    under pressure)."""
    while not done.is_set():
        route = await client.choose_route(model, session_id=SESSION, timeout_s=10)
        assert route.node_ids == (live_node,), "the live session lost its route"
        counts.served += 1
        try:
            await client.choose_route(model, timeout_s=10)
        except TrackerBusy:
            counts.probes_shed += 1


async def test_a_registration_flood_is_shed_while_live_routes_and_heartbeats_are_served(tmp_path: Path) -> None:
    process, address = await start_tracker_process(tmp_path)
    try:
        floods = [TrackerClient(address) for _ in range(CHANNELS)]
        async with TrackerClient(address) as live:
            record = fake_record(LayerRange(0, N_LAYERS), "127.0.0.1:19999", n_layers=N_LAYERS)
            await live.register(record, LIVE)
            first = await live.choose_route(record.fingerprint, session_id=SESSION)
            assert first.node_ids == (LIVE,)
            done, counts = asyncio.Event(), LiveCounts()
            keepers = [
                asyncio.create_task(keep_live(live, record.fingerprint, LIVE, done, counts)),
                asyncio.create_task(keep_heartbeating(live, LIVE, done, counts)),
            ]
            started, results = time.monotonic(), []
            # Waves of new nodes until the live calls have met the pressed tracker a few times and
            # the flood has lasted several expiry windows.
            for wave in range(WAVES):
                ids = range(wave * FLOOD, (wave + 1) * FLOOD)
                results += await asyncio.gather(*(register_one(floods[i % CHANNELS], record, i, counts) for i in ids))
                if counts.probes_shed >= 5 and time.monotonic() - started >= 3 * WINDOW:
                    break
            flood_ended = time.monotonic()
            done.set()
            await asyncio.gather(*keepers)
            for flood in floods:
                await flood.close()
        shed = [result for result in results if isinstance(result, TrackerBusy)]
        registered = [result for result in results if isinstance(result, Registered)]
        print(
            f"flood of {len(results)} registrations in {time.monotonic() - started:.1f} s: "
            f"{len(registered)} registered, {len(shed)} shed; "
            f"{counts.served} live routes and {counts.heartbeats} heartbeats served, "
            f"{counts.probes_shed} probes shed meanwhile"
        )
        assert len(shed) + len(registered) == len(results)
        assert shed, "no registration was shed: the flood never pressed the tracker"
        assert all(busy.retry_after_s >= DEFAULT_LIMITS.base_retry_s for busy in shed)
        assert counts.served >= 1 and counts.probes_shed >= 5, "the live calls never met a pressed tracker"
        assert flood_ended - started >= 3 * WINDOW, "the flood did not outlast the expiry window"
        # Heartbeats were answered to the end of the flood (each asserted known), and while
        # registrations were being shed: the node was heard throughout, not just before the flood.
        assert counts.last_heartbeat >= flood_ended - WINDOW
        assert counts.heartbeats_while_shedding >= 1, "no heartbeat was answered while registrations were shed"
    finally:
        process.kill()
        await process.wait()
