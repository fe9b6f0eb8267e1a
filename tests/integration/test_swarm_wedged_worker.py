"""A worker hung in its engine is found by the step deadline its route's measured speeds allow.

SIGSTOP freezes a whole process, which transport keepalive finds (test_swarm_hung_worker.py).
A shard whose engine stops while its process lives on (a stuck engine call) is different: its
event loop runs, its health service answers SERVING and its gRPC core answers every keepalive
ping, so before per-step deadlines the request waited for it until its own deadline (300 s on
the gateway; here the test's 30 s read timeout ends it). Now the route driver bounds the wait
for each step by what the route's nodes measured (``core.step_budget``) and fails the route with
``StepTimedOut``; as no hop probes dead, the swarm client avoids the whole route:

- with spares for every range, the client sees the failover and the answer equals the
  whole-model reference; the lost route's sessions, the wedged one included, are freed;
- without spares, the stream ends with a typed ``worker_lost`` error and ``[DONE]``;
- an honest slow step is not cut: a middle that measured itself slow (``slow_worker.py``) runs a
  230-token prefill chunk in ~7 s, longer than the budget's floor, and the answer comes through
  without a failover, because the budget grows with what the step's tokens take at that speed.

Real processes and certificates from the swarm CA (``swarm_harness``); the wedged tails run
``wedged_worker.py``, which wedges its first ring step 40 once the test removes a marker file.
Measured figures are printed (run with ``-s``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from swarm_harness import (
    LONG_PROMPT,
    PROMPT,
    Reference,
    SseResult,
    Swarm,
    chat_body,
    read_sse,
    wait_sessions_freed,
)
from wedged_worker import MARKER_ENV, WEDGE_AT_STEP

from meshnet.core.step_budget import StepBudget

pytestmark = pytest.mark.timeout(240)

WEDGED = (sys.executable, str(Path(__file__).with_name("wedged_worker.py")))
SLOW = (sys.executable, str(Path(__file__).with_name("slow_worker.py")))
HEAD, MIDDLE, TAIL = "0:2", "2:4", "4:6"
MAX_TOKENS = 120
SEEN_WITHIN_S = 3 * StepBudget().floor_s
"""The default budget's floor dominates on the tiny model (its nodes measure thousands of tokens
per second: 5.9 s); the rest is for the probe, the tracker and a loaded 2-core machine (measured
5.9-9.8 s in all). A wait for the wedged step's answer without a deadline would last the
request's 300 s."""
READ_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def marker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """While this file exists no tail wedges; removing it arms exactly one wedge."""
    path = tmp_path_factory.mktemp("wedge") / "wedged"
    path.touch()
    before = os.environ.get(MARKER_ENV)
    os.environ[MARKER_ENV] = str(path)  # the workers started below inherit it
    yield path
    if before is None:
        os.environ.pop(MARKER_ENV, None)
    else:
        os.environ[MARKER_ENV] = before


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory, model: Path, marker: Path) -> Iterator[Swarm]:
    with Swarm(tmp_path_factory.mktemp("swarm"), model) as running:
        running.start_tracker()
        running.start_workers(HEAD, HEAD, MIDDLE, MIDDLE)
        running.start_workers(TAIL, TAIL, program=WEDGED)
        running.start_gateway()
        running.wait_routable(nodes=6)
        yield running


@pytest.fixture(scope="module")
def base_url(swarm: Swarm) -> str:
    return swarm.gateways[0].ready_line.split()[3]


@pytest.fixture(scope="module")
def expected(reference: Reference) -> str:
    return reference.text(reference.generate(reference.chat_tokens(PROMPT), MAX_TOKENS))


def wedged_request(swarm: Swarm, base_url: str, marker: Path) -> tuple[SseResult, float]:
    """A request during which the route's tail wedges; the seconds from the last text chunk
    before the route's first trouble (the wedge) to the client's first sight of it."""
    marker.unlink()
    body = chat_body(MAX_TOKENS)
    result = read_sse(base_url, "/v1/chat/completions", body, headers=swarm.auth, timeout_s=READ_TIMEOUT_S)
    trouble = next(
        index
        for index, item in enumerate(result.items)
        if item.kind == "error" or (item.kind == "telemetry" and item.payload["kind"] == "route_health")
    )
    last_chunk = max(item.at for item in result.items[:trouble] if item.kind == "chunk" and item.text)
    return result, result.items[trouble].at - last_chunk


def test_a_wedged_tail_fails_over_to_spares_and_the_answer_is_unchanged(
    swarm: Swarm, base_url: str, marker: Path, expected: str
) -> None:
    body = chat_body(MAX_TOKENS)
    assert read_sse(base_url, "/v1/chat/completions", body, headers=swarm.auth).text == expected

    result, seen_s = wedged_request(swarm, base_url, marker)
    print(f"\nwedged tail at step {WEDGE_AT_STEP}: failover seen {seen_s * 1000:.0f} ms after the last token")
    assert marker.exists(), "a tail must have wedged"
    assert [event["status"] for event in result.telemetry("route_health")] == ["failover"]
    first, second = (set(hop["address"] for hop in event["hops"]) for event in result.telemetry("accepted"))
    assert not first & second, "no hop of the wedged route is used again: which one hung is unknown"
    assert not [item for item in result.items if item.kind == "error"]
    assert [item.kind for item in result.items[-1:]] == ["done"]
    assert result.text == expected
    assert seen_s <= SEEN_WITHIN_S

    freed_s = wait_sessions_freed(sorted(first), 5.0, swarm.security)
    print(f"the lost route's sessions (the wedged one included) freed {freed_s * 1000:.0f} ms after the answer")
    assert read_sse(base_url, "/v1/chat/completions", body, headers=swarm.auth).text == expected


def test_a_wedged_tail_without_spares_ends_with_a_typed_error(swarm: Swarm, base_url: str, marker: Path) -> None:
    swarm.settle()
    for layers in (HEAD, MIDDLE, TAIL):
        for extra in swarm.live_workers(layers)[1:]:
            extra.component.stop()
    swarm.wait_routable(nodes=3)

    result, seen_s = wedged_request(swarm, base_url, marker)
    kinds = [item.kind for item in result.items]
    assert kinds[-2:] == ["error", "done"], kinds[-5:]
    error = result.items[-2].payload["error"]
    print(f"\nwedged tail, no spare: {error['code']!r} and [DONE] {seen_s * 1000:.0f} ms after the last token")
    assert error["code"] == "worker_lost" and error["retryable"], error
    assert seen_s <= SEEN_WITHIN_S
    wait_sessions_freed([worker.address for worker in swarm.live_workers()], 5.0, swarm.security)


def test_an_honest_slow_prefill_chunk_is_not_cut(swarm: Swarm, base_url: str, reference: Reference) -> None:
    max_tokens = 8
    prompt = reference.chat_tokens(LONG_PROMPT)
    expected = reference.text(reference.generate(prompt, max_tokens))
    swarm.settle()
    for middle in swarm.live_workers(MIDDLE):
        middle.component.stop()
    swarm.start_workers(MIDDLE, program=SLOW)
    swarm.wait_routable(nodes=len(swarm.live_workers()))

    body = chat_body(max_tokens, content=LONG_PROMPT)
    started = time.monotonic()
    result = read_sse(base_url, "/v1/chat/completions", body, headers=swarm.auth)
    first_token_s = next(item.at for item in result.items if item.kind == "chunk" and item.text) - started
    print(f"\nslow middle: {len(prompt)}-token prompt, first token after {first_token_s:.1f} s, no failover")
    assert first_token_s > StepBudget().floor_s, "the prefill chunk must take longer than the budget's floor"
    assert result.telemetry("route_health") == []
    assert not [item for item in result.items if item.kind == "error"]
    assert result.text == expected
