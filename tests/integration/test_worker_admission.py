"""W6-style admission: a worker with room for 4 sessions, asked for 6 at once.

Pass figure: exactly 2 refused with RESOURCE_EXHAUSTED, fast (target < 50 ms from their opening
frame; measured and printed), the 4 admitted produce exactly their solo tokens, and the KV is
idle afterwards. A refusal must not queue: the worker answers it while its engine is busy.

The workers run the fake backend (``worker_harness``'s default): real processes, gRPC, engine loops
and batching, without llama.cpp. Admission is the session table's decision, taken before the
engine; that admitted sessions on llama.cpp each equal their solo runs is
tests/model/test_distributed_real.py.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator

import pytest
from worker_harness import (
    RunningWorker,
    WorkerCluster,
    fake_reference,
    fake_specs,
    greedy_request,
    metrics,
    new_driver,
    opening_frame,
    route_session,
    wait_idle,
)

from meshnet.core.errors import ResourceExhausted
from meshnet.core.events import TokenGenerated
from meshnet.core.layers import LayerRange
from meshnet.route.shard_stream import ChannelPool, ShardStream

pytestmark = pytest.mark.timeout(60)

CAPACITY = 4
REQUESTED = 6
TOKENS = 40
REJECT_TARGET_S = 0.050
REJECT_LIMIT_S = 0.250
"""The hard bound asserted; the 50 ms target is printed (a loaded 2-core CI box jitters)."""


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RunningWorker]]:
    with WorkerCluster(tmp_path_factory.mktemp("admission-worker")) as cluster:
        yield cluster.start(*fake_specs([(0, 6)], step_delay=0.02, max_sessions=CAPACITY))


def prompt(index: int) -> list[int]:
    return [(index * 5 + offset) % 64 for offset in range(4 + index)]


async def test_six_sessions_on_four_slots_two_refused_fast_four_exact(
    pool: ChannelPool, worker: list[RunningWorker]
) -> None:
    driver = new_driver(pool)
    await route_session(pool, worker)  # connect (and describe the hop) first: the timings measure admission
    before = (await metrics(pool, worker))[0]
    outputs: dict[int, list[int]] = {}
    refused: dict[int, float] = {}

    async def session(index: int) -> None:
        started = time.monotonic()
        tokens: list[int] = []
        try:
            async for event in driver.run(await route_session(pool, worker), greedy_request(prompt(index), TOKENS)):
                if isinstance(event, TokenGenerated):
                    tokens.append(event.token_id)
        except ResourceExhausted:
            refused[index] = time.monotonic() - started
            return
        outputs[index] = tokens

    await asyncio.gather(*(session(i) for i in range(REQUESTED)))
    after = (await metrics(pool, worker))[0]
    print(
        f"\nrefused {sorted(refused)} after {[f'{s * 1000:.1f} ms' for s in refused.values()]} "
        f"(driver start to error, target {REJECT_TARGET_S * 1000:.0f} ms)"
    )
    assert len(refused) == REQUESTED - CAPACITY
    assert after["rejected_admissions_total"] - before["rejected_admissions_total"] == REQUESTED - CAPACITY
    for index, tokens in outputs.items():
        assert tokens == fake_reference([LayerRange(0, 6)], greedy_request(prompt(index), TOKENS)), index
    assert max(refused.values()) < REJECT_LIMIT_S
    await wait_idle(pool, worker)


async def test_refusal_latency_while_the_engine_is_busy(pool: ChannelPool, worker: list[RunningWorker]) -> None:
    """Fill every slot (one session decoding, the rest held open), then time refused openings."""
    decoding = asyncio.Event()

    async def busy() -> None:
        async for event in new_driver(pool).run(await route_session(pool, worker), greedy_request(prompt(9), 10_000)):
            if isinstance(event, TokenGenerated):
                decoding.set()

    busy_task = asyncio.create_task(busy())
    held = [ShardStream(pool, worker[0].address, 10.0) for _ in range(CAPACITY - 1)]
    latencies = []
    try:
        for index, stream in enumerate(held):
            await stream.exchange(opening_frame(worker, f"holder-{index}", prompt(index)))
        await asyncio.wait_for(decoding.wait(), timeout=5)
        for attempt in range(10):
            late = ShardStream(pool, worker[0].address, 5.0)
            frame = opening_frame(worker, f"late-{attempt}", prompt(attempt))
            started = time.monotonic()
            with pytest.raises(ResourceExhausted):
                await late.exchange(frame)
            latencies.append(time.monotonic() - started)
            late.cancel()
        still_decoding = not busy_task.done()
    finally:
        busy_task.cancel()
        for stream in held:
            stream.cancel()
    median, worst = statistics.median(latencies), max(latencies)
    print(
        f"\nRESOURCE_EXHAUSTED after the opening frame: median {median * 1000:.1f} ms, max {worst * 1000:.1f} ms "
        f"(target {REJECT_TARGET_S * 1000:.0f} ms)"
    )
    assert still_decoding
    assert median < REJECT_TARGET_S
    assert worst < REJECT_LIMIT_S
    await wait_idle(pool, worker)
