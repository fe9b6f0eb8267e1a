"""A route of fake shard worker processes over real gRPC: exact output, idempotency, refusals.

The fake model is not split-invariant (each range mixes with its own matrix), so a distributed
run is compared with the same ranges chained in process (``LocalRoute``), and with itself.
Protocol refusals (W7, W8): a repeated step is answered again without touching the KV; a gap,
a stale epoch, a foreign recipe or the wrong layers is FAILED_PRECONDITION; a session the shard
never opened is NOT_FOUND. A refused frame ends its stream, and the session is freed everywhere.

The same kind of route on llama.cpp workers, equal to the whole model (which the fake model cannot
be): tests/integration/test_family_worker_routes.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from worker_harness import (
    RunningWorker,
    WorkerCluster,
    decode_frame,
    fake_reference,
    fake_specs,
    generate,
    greedy_request,
    metrics,
    new_driver,
    opening_frame,
    wait_idle,
)

from meshnet.core.errors import CacheMiss, FailedPrecondition, RouteStale
from meshnet.core.layers import LayerRange
from meshnet.route.driver import RouteDriver
from meshnet.route.shard_stream import ChannelPool, ShardStream
from meshnet.wire.frames import DEFAULT_MAX_FRAME_BYTES, StepFrame, StepResult
from meshnet.wire.tls import link_options

pytestmark = pytest.mark.timeout(60)

PROMPTS = {
    "short": [1, 2, 3],
    "single token": [7],
    "varied": [5, 9, 13, 2, 63, 0, 31, 17, 44],
    # Longer than the worker's prefill chunk (256): the engine runs it in several aligned chunks.
    "long": [(index * 7 + 3) % 64 for index in range(600)],
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerCluster]:
    with WorkerCluster(tmp_path_factory.mktemp("route-workers")) as running:
        running.start(*fake_specs([(0, 2), (2, 4), (4, 6), (0, 6)]))
        yield running


@pytest.fixture(scope="module")
def three(cluster: WorkerCluster) -> list[RunningWorker]:
    return cluster.workers[:3]


@pytest.fixture(scope="module")
def whole(cluster: WorkerCluster) -> list[RunningWorker]:
    return cluster.workers[3:]


@pytest.mark.parametrize("name", list(PROMPTS))
async def test_three_worker_route_equals_the_in_process_chain(
    pool: ChannelPool, three: list[RunningWorker], whole: list[RunningWorker], name: str
) -> None:
    request = greedy_request(PROMPTS[name], 24)
    driver = new_driver(pool)
    split = await generate(pool, driver, three, request)
    again = await generate(pool, driver, three, request)
    single = await generate(pool, driver, whole, request)
    assert len(split) == 24
    assert split == again, "the same route gave two different answers"
    # The fake splits bit-identically, as the real engine does: the whole model is the oracle.
    assert split == single == fake_reference([LayerRange(0, 6)], request)
    await wait_idle(pool, [*three, *whole])


def test_the_reference_tells_models_and_prompts_apart() -> None:
    # The comparison above can fail: every layer counts (a model with one more layer answers
    # otherwise), and so does every prompt token.
    request = greedy_request(PROMPTS["varied"], 24)
    expected = fake_reference([LayerRange(0, 6)], request)
    assert fake_reference([LayerRange(0, 3), LayerRange(3, 7)], request, n_layers=7) != expected
    assert fake_reference([LayerRange(0, 6)], greedy_request(PROMPTS["varied"][1:], 24)) != expected


@dataclass(frozen=True)
class OpenSession:
    """A session opened on a raw head stream, with decode step 1 done."""

    stream: ShardStream
    opening: StepFrame
    step_one: StepFrame
    first: StepResult
    second: StepResult


async def _open_and_step(pool: ChannelPool, workers: list[RunningWorker], session: str, **meta: object) -> OpenSession:
    stream = ShardStream(pool, workers[0].address, 5.0)
    opening = opening_frame(workers, session, PROMPTS["varied"], **meta)
    first = await stream.exchange(opening)
    step_one = decode_frame(opening, step=1, position=first.next_position, token=_token(first))
    return OpenSession(stream, opening, step_one, first, await stream.exchange(step_one))


def _token(result: StepResult) -> int:
    if result.token_id is None:
        raise AssertionError(f"step {result.step} sampled nothing")
    return result.token_id


async def test_duplicate_step_is_answered_again_without_touching_the_kv(
    pool: ChannelPool, three: list[RunningWorker]
) -> None:
    opened = await _open_and_step(pool, three, "dup-session")
    stream, opening, step_one, first, second = (
        opened.stream,
        opened.opening,
        opened.step_one,
        opened.first,
        opened.second,
    )
    try:
        before = await metrics(pool, three)
        repeated = await stream.exchange(step_one)
        after = await metrics(pool, three)
        assert (repeated.step, repeated.next_position, repeated.token_id) == (
            second.step,
            second.next_position,
            second.token_id,
        )
        for old, new in zip(before, after, strict=True):
            assert new["decode_steps_total"] == old["decode_steps_total"], "the duplicate ran again"
            assert new["active_sessions"] == 1
        # The KV still ends where step 1 left it: step 2 continues exactly as the reference does.
        third = await stream.exchange(
            decode_frame(opening, step=2, position=second.next_position, token=_token(second))
        )
        expected = fake_reference([w.layers for w in three], greedy_request(PROMPTS["varied"], 3))
        assert [first.token_id, second.token_id, third.token_id] == expected
        assert third.next_position == len(PROMPTS["varied"]) + 2
    finally:
        await stream.close()
    await wait_idle(pool, three)


BAD_CONTINUATIONS: dict[str, tuple[dict[str, Any], type[FailedPrecondition]]] = {
    "gap in positions": ({"position_offset": 1}, FailedPrecondition),
    "skipped step": ({"step": 3}, FailedPrecondition),
    "older epoch": ({"route_epoch": 4}, RouteStale),
    "newer epoch": ({"route_epoch": 6}, RouteStale),
    "foreign recipe": ({"fingerprint": "rcp-0000000000000000"}, FailedPrecondition),
    "wrong layers": ({"layers": LayerRange(0, 3)}, FailedPrecondition),
}


@pytest.mark.parametrize("case", list(BAD_CONTINUATIONS))
async def test_bad_continuation_is_refused_and_frees_the_session(
    pool: ChannelPool, three: list[RunningWorker], case: str
) -> None:
    changes, error_type = BAD_CONTINUATIONS[case]
    opened = await _open_and_step(pool, three, f"bad-{case.replace(' ', '-')}", route_epoch=5)
    stream, opening = opened.stream, opened.opening
    changes = dict(changes)
    position = opened.second.next_position + int(changes.pop("position_offset", 0))
    step = int(changes.pop("step", 2))
    before = await metrics(pool, three)
    try:
        with pytest.raises(error_type) as raised:
            await stream.exchange(decode_frame(opening, step=step, position=position, token=1, **changes))
    finally:
        await stream.close()
    assert type(raised.value) is error_type, f"{case}: {raised.value!r}"
    await wait_idle(pool, three)
    after = await metrics(pool, three)
    for old, new in zip(before, after, strict=True):
        assert new["decode_steps_total"] == old["decode_steps_total"], f"{case}: the refused frame ran"


@pytest.mark.parametrize(
    "case",
    ["foreign recipe", "wrong layers"],
)
async def test_opening_frame_for_another_shard_allocates_nothing(
    pool: ChannelPool, three: list[RunningWorker], case: str
) -> None:
    meta = {"fingerprint": "rcp-0000000000000000"} if case == "foreign recipe" else {"layers": LayerRange(0, 4)}
    stream = ShardStream(pool, three[0].address, 5.0)
    try:
        with pytest.raises(FailedPrecondition):
            await stream.exchange(opening_frame(three, "misrouted", [1, 2, 3], **meta))
    finally:
        await stream.close()
    assert [m["active_sessions"] for m in await metrics(pool, three)] == [0, 0, 0]


async def test_continuing_a_session_never_opened_is_a_cache_miss(pool: ChannelPool, three: list[RunningWorker]) -> None:
    opening = opening_frame(three, "never-opened", [1, 2, 3])
    stream = ShardStream(pool, three[0].address, 5.0)
    try:
        with pytest.raises(CacheMiss):
            await stream.exchange(decode_frame(opening, step=1, position=3, token=5))
    finally:
        await stream.close()
    await wait_idle(pool, three)


def test_workers_accept_the_keepalive_pings_their_peers_send() -> None:
    # Shard servers and their clients share these options. A server that allows fewer pings than
    # clients send answers GOAWAY too_many_pings after ~30 s without data and kills every stream
    # on the connection (seen live: an idle session stream died at 30 s; a 45 s idle check is too
    # slow for this suite, so the invariant is checked on the options themselves).
    options = dict(link_options(DEFAULT_MAX_FRAME_BYTES))
    assert options["grpc.http2.min_recv_ping_interval_without_data_ms"] <= options["grpc.keepalive_time_ms"]
    assert options["grpc.http2.max_ping_strikes"] == 0


async def test_decode_crosses_n_seams_per_token_on_the_ring(pool: ChannelPool, three: list[RunningWorker]) -> None:
    """Decode runs on the ring, driven by the head: the tail answers the head directly, so each
    decode token crosses 3 seams on 3 shards (the chain crossed 2(N-1) = 4)."""
    request = greedy_request(PROMPTS["short"], 24)
    before = await metrics(pool, three)
    tokens = await generate(pool, RouteDriver(pool, max_frame_bytes=DEFAULT_MAX_FRAME_BYTES), three, request)
    after = await metrics(pool, three)
    assert tokens == fake_reference([w.layers for w in three], request)
    sent = sum(a["seam_messages_total"] - b["seam_messages_total"] for a, b in zip(after, before, strict=True))
    # The one-chunk prefill (the opening frame) goes down and back on the chain: 2(N-1).
    assert sent == 4 + 3 * (len(tokens) - 1)
    await wait_idle(pool, three)
