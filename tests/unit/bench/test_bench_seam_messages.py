"""Seam messages per token, counted for real: the bench's meshnet lane on two worker processes
(the tiny synthetic model split 2 ways, loopback mTLS) reads the workers' own message counters.

The oracle is the protocol: on a ring of two shards each decode step of each session is one row
head -> tail and one answer row tail -> head, so every further token a stream decodes adds
exactly 2 rows per session. Rows of sessions that one engine step ran together share a ring
batch message (``route.ring_batch``), so a single stream sends one message per row and several
streams at most that many. The test takes the
difference of a long and a short run of the same prompts, which removes the prefill's messages
without assuming how many there are, and asserts that 2. A prompt of one chunk (as here) then
crosses like a decode step, so the figure the bench reports (the workers' count over the tokens
streamed) is exactly 2 per token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshnet.bench.remote import MeshnetLane
from meshnet.bench.stats import RunRecord, seam_messages_per_token
from meshnet.bench.tickets import LaneTickets
from meshnet.bench.workers import WorkerOptions, WorkerSet, client_security
from meshnet.core.layers import LayerRange
from meshnet.route.driver import RouteDriver
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire.frames import DEFAULT_MAX_FRAME_BYTES

pytestmark = pytest.mark.timeout(180)
PROMPTS = ((5, 9, 13, 17, 21, 25), (7, 11, 19, 23, 29, 31), (4, 8, 15, 16, 23, 42))
SHORT, LONG = 4, 12
MESSAGES_PER_DECODE_STEP = 2
"""Ring of two shards: the frame forward to the tail and the tail's answer back to the head."""


@pytest.fixture(scope="module")
def route(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WorkerSet, Path]]:
    data_dir = tmp_path_factory.mktemp("seams")
    options = WorkerOptions(tiny_model, data_dir, threads=1, max_sessions=4, context=128, prefill_chunk=64)
    running = WorkerSet("seam-count", (LayerRange(0, 2), LayerRange(2, 4)), options, timeout_s=60.0)
    try:
        yield running, data_dir
    finally:
        running.stop()


def run_lane(workers: WorkerSet, data_dir: Path, runs: list[tuple[int, int]]) -> list[RunRecord]:
    """Each (concurrency, tokens) of ``runs`` through the bench's own lane, in order."""

    async def body() -> list[RunRecord]:
        security = client_security(data_dir)
        pool = ChannelPool(DEFAULT_MAX_FRAME_BYTES, security)
        lane = MeshnetLane(
            workers,
            pool,
            RouteDriver(pool, max_frame_bytes=DEFAULT_MAX_FRAME_BYTES),
            timeout_s=60.0,
            tickets=LaneTickets(data_dir, security),
        )
        try:
            return [await lane.run(PROMPTS[:k], list(range(k)), n) for k, n in runs]
        finally:
            await pool.close()

    return asyncio.run(body())


@pytest.mark.parametrize("concurrency", [1, 3])
def test_each_decode_token_of_each_session_costs_two_seam_rows(route: tuple[WorkerSet, Path], concurrency: int) -> None:
    workers, data_dir = route
    short, long = run_lane(workers, data_dir, [(concurrency, SHORT), (concurrency, LONG)])
    for record, tokens in ((short, SHORT), (long, LONG)):
        assert all(t.error is None and len(t.tokens) == tokens for t in record.requests)
        assert record.seam_messages is not None and record.seam_messages > 0
        assert record.seam_rows is not None and record.seam_messages <= record.seam_rows
        if concurrency == 1:
            assert record.seam_messages == record.seam_rows  # nothing to share a message with
    extra_tokens = (LONG - SHORT) * concurrency
    assert long.seam_rows is not None and short.seam_rows is not None
    assert long.seam_rows - short.seam_rows == MESSAGES_PER_DECODE_STEP * extra_tokens
    # What the decode steps leave over is the prefill's share: a one-chunk prompt crosses like a
    # decode step (its frame to the tail, the first token back), so per token streamed it is 2.
    prefill = short.seam_rows - MESSAGES_PER_DECODE_STEP * (SHORT - 1) * concurrency
    assert prefill == MESSAGES_PER_DECODE_STEP * concurrency
    per_token = seam_messages_per_token(long)
    assert per_token is not None and 0 < per_token <= MESSAGES_PER_DECODE_STEP
    if concurrency == 1:
        assert per_token == MESSAGES_PER_DECODE_STEP
