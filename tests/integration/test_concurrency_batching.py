"""Eight concurrent sessions through a 3-worker route: batched, isolated, and cancellable (W1-style).

Pass figure: each session equals its solo run (0 lost, 0 cross-talk); two sessions cancelled
midway leave the other six unaffected; KV back to idle on every worker; and the workers
really batched (decode steps per engine batch > 1 during the concurrent run).

The workers run the fake backend (``worker_harness``'s default): real processes, gRPC, engine loops
and batching, without llama.cpp. It cannot show llama.cpp's KV isolation or numerics under
batching: eight concurrent sessions on llama.cpp workers, each equal to the whole model alone, are
tests/integration/test_family_worker_routes.py and tests/model/test_distributed_real.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from worker_harness import (
    RunningWorker,
    WorkerCluster,
    fake_reference,
    fake_specs,
    generate,
    greedy_request,
    metrics,
    new_driver,
    route_session,
    wait_idle,
)

from meshnet.core.events import TokenGenerated
from meshnet.core.generation import GenerationRequest
from meshnet.route.shard_stream import ChannelPool

pytestmark = pytest.mark.timeout(60)

SESSIONS = 8
CANCELLED = (2, 5)
CANCEL_AFTER = 10


STEP_DELAY = 0.01


@pytest.fixture(scope="module")
def routes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[RunningWorker], list[RunningWorker]]]:
    """A slowed route the concurrent run shares, and an unslowed twin (same ranges) for solo runs."""
    with WorkerCluster(tmp_path_factory.mktemp("batching-workers")) as cluster:
        ranges = [(0, 2), (2, 4), (4, 6)]
        workers = cluster.start(*fake_specs(ranges, step_delay=STEP_DELAY), *fake_specs(ranges))
        yield workers[:3], workers[3:]


def request(index: int) -> GenerationRequest:
    # Different prompts and lengths, so sessions join and leave the batch at different steps.
    prompt = [(index * 13 + offset * 7 + 1) % 64 for offset in range(2 + 5 * index)]
    return greedy_request(prompt, 20 + 3 * index)


async def test_eight_concurrent_sessions_equal_their_solo_runs_and_cancel_cleanly(
    pool: ChannelPool, routes: tuple[list[RunningWorker], list[RunningWorker]]
) -> None:
    route, twin = routes
    driver = new_driver(pool)
    solo = [await generate(pool, driver, twin, request(i)) for i in range(SESSIONS)]
    assert solo == [fake_reference([w.layers for w in route], request(i)) for i in range(SESSIONS)]
    assert len({tuple(tokens) for tokens in solo}) == SESSIONS, "sessions must differ to detect cross-talk"

    before = await metrics(pool, route)
    produced: list[list[int]] = [[] for _ in range(SESSIONS)]
    reached = [asyncio.Event() for _ in range(SESSIONS)]

    async def session(index: int) -> None:
        async for event in driver.run(await route_session(pool, route), request(index)):
            if isinstance(event, TokenGenerated):
                produced[index].append(event.token_id)
                if len(produced[index]) == CANCEL_AFTER:
                    reached[index].set()

    tasks = [asyncio.create_task(session(i)) for i in range(SESSIONS)]
    try:
        for index in CANCELLED:
            await asyncio.wait_for(reached[index].wait(), timeout=10)
            tasks[index].cancel()
        during = await metrics(pool, route)
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=30)
    finally:
        for task in tasks:
            task.cancel()
    after = await metrics(pool, route)

    for index in range(SESSIONS):
        if index in CANCELLED:
            assert isinstance(results[index], asyncio.CancelledError)
            assert CANCEL_AFTER <= len(produced[index]) < len(solo[index])
            assert produced[index] == solo[index][: len(produced[index])]
        else:
            assert results[index] is None, results[index]
            assert produced[index] == solo[index], f"session {index} differs from its solo run"
    assert all(m["active_sessions"] >= SESSIONS - len(CANCELLED) for m in during)
    # While all 8 decode (up to the cancellations) the engines batch about 2 steps per call: the
    # eager scheduler runs whatever is queued, and sessions spread over the 3 pipeline stages.
    # Without batching every figure is exactly 1.0; how far above it depends on the machine's
    # load (a busy 2-core box was seen at 1.5), so the bound asks only that batches form.
    while_eight = _steps_per_batch(before, during)
    overall = _steps_per_batch(before, after)
    print(
        f"\ndecode steps per engine batch: {while_eight} while 8 ran, {overall} over the whole run; "
        f"lifetime batch_occupancy {[round(m['batch_occupancy'], 2) for m in after]}"
    )
    assert all(o > 1.25 for o in while_eight), while_eight
    assert all(o > 1.0 for o in overall), overall
    assert all(m["batch_occupancy"] > 1.0 for m in after)
    # The ring's decode frames of sessions stepped together crossed each seam in one batch, and the
    # tail returned their tokens to the head in one message: every worker sent fewer messages than
    # session rows. On a session's own stream every message is one row, so without batching the
    # two counts are equal.
    messages, rows = _delta(before, after, "seam_messages_total"), _delta(before, after, "seam_rows_total")
    print(f"seam messages {messages}, rows {rows} (head, middle, tail)")
    assert all(m < r for m, r in zip(messages, rows, strict=True)), (messages, rows)
    await wait_idle(pool, route)


def _delta(before: list[dict[str, float]], after: list[dict[str, float]], name: str) -> list[int]:
    return [int(a[name] - b[name]) for a, b in zip(after, before, strict=True)]


def _steps_per_batch(before: list[dict[str, float]], after: list[dict[str, float]]) -> list[float]:
    return [
        round(
            (a["decode_steps_total"] - b["decode_steps_total"])
            / max(a["decode_batches_total"] - b["decode_batches_total"], 1),
            2,
        )
        for a, b in zip(after, before, strict=True)
    ]
