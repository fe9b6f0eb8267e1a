"""Queue, don't refuse: 64 concurrent streams against a swarm of 8 session slots all complete.

The gateway is started without limits, so it takes them from the tracker (the head shard's 8
sessions; 8 queue places per slot). Identical greedy prompts must give identical text however
long each waited. A second gateway with a small queue shows the bound: beyond it, 503s arrive at
once, with Retry-After values spread rather than one moment for everyone.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest
from swarm_harness import SseResult, Swarm, chat_body, read_sse, write_tiny_model

from meshnet.gateway.config import GatewayConfig

pytestmark = pytest.mark.timeout(180)

CLIENTS = 64
SLOTS = 8
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    root = tmp_path_factory.mktemp("queue")
    with Swarm(root, write_tiny_model(root)) as running:
        running.start_tracker()
        running.start_workers("0:2", "2:4", "4:6")  # 8 sessions each (the worker default)
        running.wait_routable(nodes=3)
        yield running


def test_64_concurrent_streams_on_8_slots_all_complete(swarm: Swarm) -> None:
    base_url = swarm.start_gateway()
    results: list[SseResult] = []
    go = threading.Barrier(CLIENTS)

    def one() -> None:
        go.wait()
        results.append(
            read_sse(base_url, "/v1/chat/completions", chat_body(MAX_TOKENS), timeout_s=120, headers=swarm.auth)
        )

    started = time.monotonic()
    threads = [threading.Thread(target=one) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=150)
    elapsed = time.monotonic() - started
    health = httpx.get(base_url + "/health", timeout=5).json()

    assert [result.status for result in results] == [200] * CLIENTS
    assert len({result.text for result in results}) == 1 and results[0].text
    assert (health["capacity"], health["queue_limit"]) == (SLOTS, 8 * SLOTS)
    waits = sorted(result.telemetry("accepted")[0]["queue_seconds"] for result in results)
    queued = [result for result in results if result.telemetry("queued")]
    assert len(queued) >= CLIENTS // 2, "the burst did not queue"  # threads arrive over a few 100 ms
    for result in queued:
        kinds = [event["kind"] for event in result.telemetry()]
        assert kinds.index("queued") < kinds.index("accepted")
        assert result.telemetry("queued")[0]["position"] >= 1
    p95 = waits[int(0.95 * (len(waits) - 1))]
    print(
        f"\n{CLIENTS} streams on {SLOTS} slots in {elapsed:.2f} s: {len(queued)} queued; time in queue "
        f"median {statistics.median(waits):.2f} s, p95 {p95:.2f} s, max {waits[-1]:.2f} s"
    )


def test_beyond_the_queue_bound_503s_arrive_at_once_with_spread_retry_after(swarm: Swarm) -> None:
    base_url = swarm.start_gateway(http=GatewayConfig(max_in_flight=2, max_queue=2))
    burst = 16
    answers: list[tuple[int, float, str | None]] = []
    lock = threading.Lock()
    done = threading.Event()
    go = threading.Barrier(burst)

    def one(stack: ExitStack) -> None:
        client = stack.enter_context(httpx.Client(timeout=60, headers=swarm.auth))
        go.wait()
        sent = time.monotonic()
        response = stack.enter_context(client.stream("POST", base_url + "/v1/chat/completions", json=chat_body(400)))
        with lock:
            answers.append((response.status_code, time.monotonic() - sent, response.headers.get("retry-after")))
            if len(answers) == burst:
                done.set()
        done.wait(timeout=30)  # admitted and queued ones stay open until every answer is in

    with ExitStack() as stack:
        threads = [threading.Thread(target=one, args=(stack,)) for _ in range(burst)]
        for thread in threads:
            thread.start()
        assert done.wait(timeout=30), f"only {len(answers)} answers"
        for thread in threads:
            thread.join(timeout=30)
    # Counted once all answers are in: admitted streams answer 200 as they arrive, among the 503s.
    refused = [answer for answer in answers if answer[0] == 503]
    assert len(refused) == burst - 4, answers
    assert max(seconds for _, seconds, _ in refused) < 1.0, "refusals must not wait"
    retry_after = [int(value) for _, _, value in refused if value is not None]
    assert len(retry_after) == len(refused) and min(retry_after) >= 1
    assert len(set(retry_after)) >= 2, f"every refused client told the same moment: {retry_after}"
    print(f"\n{len(refused)} refused at once; Retry-After values {sorted(retry_after)}")
