"""G12 / G9: SIGTERM a worker in the middle of a route while 8 sessions decode through it.

Pass figure: health NOT_SERVING within 1 s; new sessions refused with UNAVAILABLE (directly and
through the route); every in-flight session finishes with exactly its solo tokens; the process
exits 0 within its drain grace; no KV is left on the shards that keep running.

The workers run the fake backend (``worker_harness``'s default): real processes, gRPC, engine loops
and batching, without llama.cpp. The drain does not depend on the engine; sessions of llama.cpp
workers under failures are test_swarm_failover.py's.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2
from worker_harness import (
    RunningWorker,
    WorkerCluster,
    fake_reference,
    fake_specs,
    generate,
    greedy_request,
    health_status,
    new_driver,
    raw_channel,
    raw_session,
    route_session,
    unsigned_ticket,
    wait_idle,
)

from meshnet.core.errors import Unavailable
from meshnet.core.events import TokenGenerated
from meshnet.core.generation import SamplingParams
from meshnet.core.ids import RequestId, SessionId
from meshnet.route.shard_admin import fetch_capability
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire.frames import FrameMeta, HopSpec, StepFrame
from meshnet.wire.shard_wire import frame_to_proto

pytestmark = pytest.mark.timeout(60)

SESSIONS = 8
TOKENS = 60
DRAIN_GRACE_S = 10.0


def prompt(index: int) -> list[int]:
    return [(index * 11 + offset * 3) % 64 for offset in range(3 + index)]


async def test_sigterm_drains_in_flight_sessions_and_refuses_new_ones(tmp_path: Path, pool: ChannelPool) -> None:
    with WorkerCluster(tmp_path) as cluster:
        # Room for one session more than run, so the late one can only be refused for the drain.
        route = cluster.start(
            *fake_specs([(0, 2), (2, 4), (4, 6)], step_delay=0.01, drain_grace=DRAIN_GRACE_S, max_sessions=SESSIONS + 1)
        )
        middle = route[1]
        ranges = [w.layers for w in route]
        expected = [fake_reference(ranges, greedy_request(prompt(i), TOKENS)) for i in range(SESSIONS)]
        produced: list[list[int]] = [[] for _ in range(SESSIONS)]
        all_decoding = asyncio.Event()

        async def session(index: int) -> None:
            async for event in new_driver(pool).run(
                await route_session(pool, route), greedy_request(prompt(index), TOKENS)
            ):
                if isinstance(event, TokenGenerated):
                    produced[index].append(event.token_id)
                    if all(len(p) >= 3 for p in produced):
                        all_decoding.set()

        tasks = [asyncio.create_task(session(i)) for i in range(SESSIONS)]
        health_channel = raw_channel(middle.address)
        try:
            await asyncio.wait_for(all_decoding.wait(), timeout=15)
            middle.send_signal(signal.SIGTERM)
            terminated = time.monotonic()
            not_serving_after = await _not_serving(health_channel, terminated)
            # Refused at the draining shard itself, and through a route that crosses it.
            direct = await raw_session(health_channel, [_middle_opening(route[0], middle, route[2])])
            with pytest.raises(Unavailable):
                await generate(pool, new_driver(pool), route, greedy_request([1, 2, 3], 5))
            capability = await fetch_capability(pool, middle.address)
            in_flight = sum(not t.done() for t in tasks)
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=DRAIN_GRACE_S)
            finished_after = time.monotonic() - terminated
            exit_code = await asyncio.to_thread(middle.wait_exit, DRAIN_GRACE_S + 3)
            exited_after = time.monotonic() - terminated
        finally:
            for task in tasks:
                task.cancel()
            await health_channel.close()
        print(
            f"\nSIGTERM: NOT_SERVING after {not_serving_after * 1000:.0f} ms; {in_flight} in-flight session(s) "
            f"finished {finished_after:.2f} s after it; exit {exit_code} after {exited_after:.2f} s"
        )
        assert not_serving_after <= 1.0
        assert direct.code == grpc.StatusCode.UNAVAILABLE, direct.details
        assert capability.free_sessions == 0
        assert in_flight == SESSIONS, "sessions finished before the drain began: nothing was tested"
        assert produced == expected
        assert exit_code == 0
        assert exited_after < DRAIN_GRACE_S
        await wait_idle(pool, [route[0], route[2]])


async def _not_serving(channel: grpc.aio.Channel, since: float) -> float:
    while True:
        status = await health_status(channel)
        if status == health_pb2.HealthCheckResponse.NOT_SERVING:
            return time.monotonic() - since
        if time.monotonic() - since > 2.0:
            raise AssertionError(f"health still {status} 2 s after SIGTERM")
        await asyncio.sleep(0.01)


def _middle_opening(head: RunningWorker, middle: RunningWorker, tail: RunningWorker) -> bytes:
    meta = FrameMeta(
        RequestId("req-late"), SessionId("s-late"), 0, middle.fingerprint, middle.layers, "prefill", 0, 0, "new"
    )
    hops = (HopSpec(tail.address, tail.layers, tail.fingerprint, tail.node_id),)
    placed = [HopSpec(w.address, w.layers, w.fingerprint, w.node_id) for w in (head, middle, tail)]
    ticket = unsigned_ticket(placed, "s-late", fingerprint=middle.fingerprint)
    hidden = np.ones((2, 16), np.float32)
    frame = StepFrame(meta, hidden=hidden, downstream=hops, sampling=SamplingParams(), ticket=ticket)
    return frame_to_proto(frame).SerializeToString()
