"""One ShardMetrics value, read after known work on a route wired as production wires it
(``worker_shards``), and the three views of it: the GetMetrics figures, the Prometheus
exposition and the heartbeat's NodeLoad.

The shards run ``FakeBackend`` (see ``worker_shards`` for what stands in for what): it shows the
protocol, not llama.cpp numerics or KV isolation, which tests/unit/engine/test_engine_sessions.py
and test_engine_split_exact.py show on real llama.cpp, and tests/model over real worker processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from worker_shards import CAPACITY, Route, admission_policy, decode, opening, start_route

from meshnet.core.errors import ResourceExhausted
from meshnet.core.ids import SessionId
from meshnet.node.metrics import ShardMetrics
from meshnet.telemetry.prometheus import build_registry, render

TWO = ((0, 3), (3, 6))
PROMPT = (5, 4, 3, 2, 1, 2, 3, 4)  # 8 tokens: two prefill chunks of 4


@pytest.fixture
async def route() -> AsyncIterator[Route]:
    started = await start_route(TWO, policy=admission_policy(2, evict_idle_after=600.0))
    yield started
    await started.close()


async def generate(route: Route, session: str, n_tokens: int) -> None:
    first = opening(route, session, PROMPT)
    result = await route.head.handle(first, None)
    for step in range(1, n_tokens):
        assert result.token_id is not None
        result = await route.head.handle(
            decode(first, step=step, position=result.next_position, token=result.token_id), None
        )


async def test_metrics_count_the_work_each_shard_did(route: Route) -> None:
    await generate(route, "s", 5)
    for shard in route.shards:
        metrics = shard.metrics()
        assert (metrics.prefill_tokens, metrics.decode_steps, metrics.decode_batches) == (8, 4, 4)
        assert (metrics.active_sessions, metrics.free_sessions, metrics.max_sessions) == (1, 1, 2)
        assert metrics.kv_used_fraction == 0.5 and metrics.batch_occupancy == 1.0
        assert metrics.kv_bytes_in_use == CAPACITY.kv_bytes_per_session
        assert metrics.weight_bytes == CAPACITY.weight_bytes
        assert metrics.engine_busy_seconds > 0.0
        assert (metrics.rejected_admissions, metrics.evictions, metrics.expired_steps) == (0, 0, 0)
        assert metrics.queue_depth == 0 and not metrics.draining
        # One message over a seam per frame: the opening frame down the chain and its answer
        # back, then each decode step forwarded by the head and answered by the tail on the ring.
        assert metrics.seam_messages == 5
    await route.head.end(SessionId("s"), "done")
    assert [s.metrics().active_sessions for s in route.shards] == [0, 0]


async def test_rejections_are_counted_where_they_happen(route: Route) -> None:
    await generate(route, "a", 1)
    await generate(route, "b", 1)
    with pytest.raises(ResourceExhausted):
        await generate(route, "c", 1)
    assert [s.metrics().rejected_admissions for s in route.shards] == [1, 0]
    route.head.start_draining()
    assert route.head.metrics().draining


def test_the_exposed_figures_are_the_typed_ones_by_name() -> None:
    metrics = sample()
    values = metrics.values()
    assert values["decode_steps_total"] == 12.0 and values["decode_batches_total"] == 4.0
    assert values["batch_occupancy"] == 3.0
    assert values["kv_used_fraction"] == 0.75 and values["kv_bytes_in_use"] == 300.0
    assert values["draining"] == 0.0 and values["rejected_admissions_total"] == 2.0
    assert len(values) == 35
    assert values["snapshots_taken_total"] == 0.0 and values["snapshot_peer"] == 0.0
    assert values["seam_messages_total"] == 0.0 and values["capability_calls_total"] == 0.0
    assert values["seam_rows_total"] == 0.0


def test_prometheus_shows_counters_and_gauges_of_the_same_value() -> None:
    metrics = sample()
    text = render(build_registry("meshnet_worker", metrics.values, {"layers": "0:3"})).decode()
    assert 'meshnet_worker_decode_steps_total{layers="0:3"} 12.0' in text
    assert "# TYPE meshnet_worker_decode_steps_total counter" in text
    assert 'meshnet_worker_active_sessions{layers="0:3"} 3.0' in text
    assert "# TYPE meshnet_worker_active_sessions gauge" in text


def test_the_heartbeat_load_carries_the_same_figures() -> None:
    load = sample().node_load((("127.0.0.1:1", 2.5),))
    assert (load.active_sessions, load.free_sessions, load.queue_depth) == (3, 1, 7)
    assert load.kv_used_fraction == 0.75
    assert load.peer_rtt_ms == (("127.0.0.1:1", 2.5),)
    # Memory against the plan: weights, what the cost model counts besides, and the KV in use.
    assert (load.memory_used_bytes, load.memory_budget_bytes) == (1000 + 500 + 3 * 100, 1000 + 500 + 4 * 100)


def sample() -> ShardMetrics:
    return ShardMetrics(
        active_sessions=3,
        free_sessions=1,
        max_sessions=4,
        queue_depth=7,
        decode_steps=12,
        decode_batches=4,
        prefill_tokens=100,
        engine_busy_seconds=1.5,
        rejected_admissions=2,
        evictions=1,
        expired_steps=0,
        draining=False,
        kv_bytes_per_session=100,
        weight_bytes=1000,
        other_bytes=500,
    )
