"""Cancellation, client death and deadlines free the KV on every shard of the route (G1, G3, W5).

The workers slow each engine batch a little, so the driver is surely mid-decode when the test
cancels it, closes it, kills its process, or lets its deadline pass.

The workers run the fake backend (``worker_harness``'s default): real processes, gRPC, engine loops
and batching, without llama.cpp. KV freed after cancellation on llama.cpp workers:
test_swarm_admission.py (closed streams free every worker's session) and
tests/model/test_lab_real.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from worker_harness import (
    RunningWorker,
    WorkerCluster,
    fake_specs,
    greedy_request,
    metrics,
    new_driver,
    route_session,
    wait_idle,
)

from meshnet.core.errors import DeadlineExceeded
from meshnet.core.events import TokenGenerated
from meshnet.route.shard_stream import ChannelPool

pytestmark = pytest.mark.timeout(60)

STEP_DELAY = 0.01
FREED_WITHIN_S = 1.0
PROMPT = [4, 8, 15, 16, 23, 42]


@pytest.fixture(scope="module")
def route(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RunningWorker]]:
    with WorkerCluster(tmp_path_factory.mktemp("cancel-workers")) as cluster:
        yield cluster.start(*fake_specs([(0, 2), (2, 4), (4, 6)], step_delay=STEP_DELAY))


async def _decode_until(pool: ChannelPool, route: list[RunningWorker], tokens: int, reached: asyncio.Event) -> None:
    events = new_driver(pool).run(await route_session(pool, route), greedy_request(PROMPT, 10_000))
    count = 0
    async for event in events:
        if isinstance(event, TokenGenerated):
            count += 1
            if count == tokens:
                reached.set()


async def test_cancelling_the_driver_task_frees_every_shard(pool: ChannelPool, route: list[RunningWorker]) -> None:
    reached = asyncio.Event()
    task = asyncio.create_task(_decode_until(pool, route, 5, reached))
    await asyncio.wait_for(reached.wait(), timeout=10)
    assert [m["active_sessions"] for m in await metrics(pool, route)] == [1, 1, 1]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    freed = await wait_idle(pool, route, within_s=FREED_WITHIN_S)
    print(f"\ncancelled task: KV freed on every shard {freed * 1000:.0f} ms after the cancel")


async def test_closing_the_event_stream_frees_every_shard(pool: ChannelPool, route: list[RunningWorker]) -> None:
    events = new_driver(pool).run(await route_session(pool, route), greedy_request(PROMPT, 10_000))
    count = 0
    async for event in events:
        count += isinstance(event, TokenGenerated)
        if count == 3:
            break
    assert [m["active_sessions"] for m in await metrics(pool, route)] == [1, 1, 1]
    await events.aclose()  # type: ignore[attr-defined]
    freed = await wait_idle(pool, route, within_s=FREED_WITHIN_S)
    print(f"\naclose: KV freed on every shard {freed * 1000:.0f} ms after closing the stream")


CLIENT = """
import asyncio, json, sys, time
from meshnet.route.driver import RouteDriver, RouteSession
from meshnet.wire.ticket_wire import issue_ticket
from meshnet.route.shard_stream import ChannelPool
from meshnet.core.events import RouteHop, TokenGenerated
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeCapability

async def main():
    spec = json.loads(sys.argv[1])
    hops = tuple(
        RouteHop(NodeId(h[0]), h[1], LayerRange(h[2], h[3]), NodeCapability(**h[4])) for h in spec["hops"]
    )
    ticket = issue_ticket(
        hops, session_id=SessionId("s-doomed"), request_id=None, epoch=0, fingerprint=spec["fingerprint"],
        holder=None, now_unix_s=time.time(), seconds=600.0, signer=None,
    )
    route = RouteSession(RequestId("req-doomed"), SessionId("s-doomed"), hops, spec["fingerprint"], 0, ticket)
    driver = RouteDriver(ChannelPool(4 << 20), max_frame_bytes=4 << 20)
    async for event in driver.run(route, GenerationRequest(tuple(spec["prompt"]), 10_000)):
        if isinstance(event, TokenGenerated):
            print("token", event.token_id, flush=True)

asyncio.run(main())
"""


async def test_client_process_killed_frees_every_shard(pool: ChannelPool, route: list[RunningWorker]) -> None:
    spec = {
        "hops": [
            [w.node_id, w.address, w.layers.start, w.layers.stop, asdict((await w.hop(pool)).capability)] for w in route
        ],
        "fingerprint": route[0].fingerprint,
        "prompt": PROMPT,
    }
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert client.stdout is not None
        stdout = client.stdout
        lines = await asyncio.wait_for(asyncio.to_thread(lambda: [stdout.readline() for _ in range(3)]), 20)
        assert all(line.startswith("token") for line in lines), lines
        assert [m["active_sessions"] for m in await metrics(pool, route)] == [1, 1, 1]
        client.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        freed = await wait_idle(pool, route, within_s=FREED_WITHIN_S)
        print(f"\nSIGKILLed client: KV freed on every shard {(time.monotonic() - killed) * 1000:.0f} ms after")
    finally:
        client.kill()
        client.wait(timeout=5)
        if client.stdout is not None:
            client.stdout.close()
    assert freed <= FREED_WITHIN_S


async def test_deadline_stops_the_request_promptly_and_leaves_no_kv(tmp_path: Path, pool: ChannelPool) -> None:
    # Each engine batch takes 50 ms here, so a 200 ms budget runs out during decode.
    with WorkerCluster(tmp_path) as cluster:
        slow = cluster.start(*fake_specs([(0, 3), (3, 6)], step_delay=0.05))
        before = await metrics(pool, slow)
        budget = 0.2
        request = greedy_request(PROMPT, 1000, timeout_s=budget)
        produced = 0
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            async for event in new_driver(pool).run(await route_session(pool, slow), request):
                produced += isinstance(event, TokenGenerated)
        raised_after = time.monotonic() - started
        freed = await wait_idle(pool, slow, within_s=FREED_WITHIN_S)
        after = await metrics(pool, slow)
        print(
            f"\ndeadline {budget * 1000:.0f} ms: DeadlineExceeded after {raised_after * 1000:.0f} ms, "
            f"{produced} token(s); KV freed {freed * 1000:.0f} ms later"
        )
        # G1: the caller hears within the deadline + 100 ms (+ one 50 ms batch of slack).
        assert raised_after < budget + 0.15
        assert produced < 5
        # Nothing ran on the engine after the deadline: the last shard saw at most what was sent in time.
        steps = [a["decode_steps_total"] - b["decode_steps_total"] for a, b in zip(after, before, strict=True)]
        assert max(steps) <= produced
