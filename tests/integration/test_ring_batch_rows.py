"""Ring batch rows fail alone: a bad row sent through the real RingBatch RPC ends only the session
it names, and a row for a session the worker does not hold is refused without touching anyone.

Four sessions decode concurrently on a 2-worker route (their decode frames and the tail's answers
travel in ring batches); a stranger's RingBatch stream sends the tail one row with a wrong
checksum for one session's id, and one row for a session nobody opened. The named session ends
with IntegrityError, as a bad frame on its own stream would end it; the three others finish equal
to the in-process chain of the same fake shards (the oracle).

The workers run the fake backend (``worker_harness``'s default): real processes, gRPC, engine loops
and batching, without llama.cpp.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from worker_harness import FAKE, WorkerCluster, fake_reference, fake_specs, greedy_request, new_driver, route_session

from meshnet.core.errors import IntegrityError
from meshnet.core.events import TokenGenerated
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import RequestId, SessionId
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire import services
from meshnet.wire.batch_wire import refused_from_proto
from meshnet.wire.frames import FrameMeta, StepFrame
from meshnet.wire.shard_wire import frame_to_proto

pytestmark = pytest.mark.timeout(90)

SESSIONS = 4
VICTIM = 1
STRIKE_AFTER = 5


def request(index: int) -> GenerationRequest:
    prompt = [(index * 11 + offset * 5 + 2) % 64 for offset in range(3 + 2 * index)]
    # The victim decodes until it is struck (its context, 2048 positions, outlasts the test).
    return greedy_request(prompt, 1_500 if index == VICTIM else 24 + 4 * index)


def tail_row(session_id: str, tail_layers: object, fingerprint: str) -> services.StepRequest:
    """A well-formed decode row into the tail, but for its checksum."""
    meta = FrameMeta(
        request_id=RequestId("req-stranger"),
        session_id=SessionId(session_id),
        route_epoch=0,
        fingerprint=fingerprint,
        layers=tail_layers,  # type: ignore[arg-type]
        phase="decode",
        position=100,
        step=50,
        cache="continue",
    )
    hidden = np.ones((1, FAKE.n_embd), np.float32)
    row = frame_to_proto(StepFrame(meta, hidden=hidden, ring=True))
    row.header.checksum ^= 0x5A5A
    return row


async def test_a_bad_row_ends_only_its_session_and_an_unknown_one_is_refused(tmp_path: Path, pool: ChannelPool) -> None:
    with WorkerCluster(tmp_path) as cluster:
        route = cluster.start(*fake_specs([(0, 3), (3, 6)], step_delay=0.01))
        expected = [fake_reference([w.layers for w in route], request(i)) for i in range(SESSIONS)]
        driver = new_driver(pool)
        sessions = [await route_session(pool, route) for _ in range(SESSIONS)]
        produced: list[list[int]] = [[] for _ in range(SESSIONS)]
        struck = asyncio.Event()

        async def run(index: int) -> None:
            async for event in driver.run(sessions[index], request(index)):
                if isinstance(event, TokenGenerated):
                    produced[index].append(event.token_id)
                    if index == VICTIM and len(produced[index]) == STRIKE_AFTER:
                        struck.set()

        tasks = [asyncio.create_task(run(i)) for i in range(SESSIONS)]
        try:
            await asyncio.wait_for(struck.wait(), timeout=30)
            tail = route[-1]
            call = pool.stub(tail.address).RingBatch()
            bad = tail_row(sessions[VICTIM].session_id, tail.layers, tail.fingerprint)
            stranger = tail_row("nobody-opened-this", tail.layers, tail.fingerprint)
            await call.write(services.StepBatch(rows=[bad, stranger]))
            refused = refused_from_proto(await call.read())
            results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=60)
            call.cancel()
        finally:
            for task in tasks:
                task.cancel()

    assert [(r.session_id, r.step) for r in refused] == [("nobody-opened-this", 50)]
    assert isinstance(results[VICTIM], IntegrityError), results[VICTIM]
    assert produced[VICTIM] == expected[VICTIM][: len(produced[VICTIM])]
    for index in range(SESSIONS):
        if index != VICTIM:
            assert results[index] is None, results[index]
            assert produced[index] == expected[index], f"session {index} differs from the chain in process"
