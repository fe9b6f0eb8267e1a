"""H2 and H3 against a live gateway over real workers (the unit tests cover the full matrix).

H2: malformed input is a 4xx OpenAI-style error, never a 500, and never reaches a worker.
H3: with no queue (--max-queue 0), a burst of max_in_flight + 5 slow requests admits exactly
max_in_flight; the rest get an immediate 503 with Retry-After, and the admitted ones keep streaming.
(test_gateway_queue_load.py covers the queue itself.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
from swarm_harness import CONTEXT, MODEL_NAME, Swarm, active_sessions, chat_body, wait_sessions_freed, write_tiny_model

from meshnet.gateway.config import GatewayConfig

pytestmark = pytest.mark.timeout(60)

MAX_IN_FLIGHT = 2
BURST = MAX_IN_FLIGHT + 5
SLOW_MAX_TOKENS = 400
"""At ~100 tokens/s an admitted request runs for seconds: far longer than the burst takes."""


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    root = tmp_path_factory.mktemp("swarm")
    with Swarm(root, write_tiny_model(root)) as running:
        running.start_tracker()
        running.start_workers("0:2", "2:4", "4:6")
        running.start_gateway(http=GatewayConfig(max_in_flight=MAX_IN_FLIGHT, max_queue=0))
        running.wait_routable(nodes=3)
        yield running


@pytest.fixture(scope="module")
def base_url(swarm: Swarm) -> str:
    return swarm.gateways[0].ready_line.split()[3]


def _post(swarm: Swarm, base_url: str, path: str, **kwargs: Any) -> httpx.Response:
    headers = {**swarm.auth, **kwargs.pop("headers", {})}
    return httpx.post(base_url + path, timeout=30, headers=headers, **kwargs)


def _assert_openai_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"]
    assert set(error) >= {"message", "type", "code", "param"}
    return error


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_bad_json_is_400(swarm: Swarm, base_url: str, path: str) -> None:
    truncated = b'{"model": "tiny", "messages": ['
    response = _post(swarm, base_url, path, content=truncated, headers={"content-type": "application/json"})
    error = _assert_openai_error(response, 400, "invalid_json")
    assert error["type"] == "invalid_request_error"


def test_wrong_types_are_400(swarm: Swarm, base_url: str) -> None:
    body = {**chat_body(4, stream=False), "max_tokens": "ten"}
    error = _assert_openai_error(_post(swarm, base_url, "/v1/chat/completions", json=body), 400, "invalid_parameter")
    assert error["param"] == "max_tokens"
    _assert_openai_error(
        _post(swarm, base_url, "/v1/chat/completions", json={"model": MODEL_NAME}), 400, "missing_required_parameter"
    )


def test_unknown_model_is_404(swarm: Swarm, base_url: str) -> None:
    body = {**chat_body(4, stream=False), "model": "no-such-model"}
    error = _assert_openai_error(_post(swarm, base_url, "/v1/chat/completions", json=body), 404, "model_not_found")
    assert error["param"] == "model"


def test_huge_max_tokens_is_400(swarm: Swarm, base_url: str) -> None:
    for stream in (False, True):
        body = chat_body(10**9, stream=stream)
        error = _assert_openai_error(
            _post(swarm, base_url, "/v1/chat/completions", json=body), 400, "invalid_parameter"
        )
        assert error["param"] == "max_tokens"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_prompt_beyond_the_workers_context_is_400_before_any_work(swarm: Swarm, base_url: str, stream: bool) -> None:
    """The workers hold CONTEXT positions per session, fewer than the GGUF's trained context."""
    addresses = [w.address for w in swarm.live_workers()]
    too_long = {"model": MODEL_NAME, "prompt": "a " * (CONTEXT + 50), "max_tokens": 8, "stream": stream}
    started = time.monotonic()
    response = _post(swarm, base_url, "/v1/completions", json=too_long)
    _assert_openai_error(response, 400, "context_length_exceeded")
    # Fits the prompt, but not prompt + max_tokens: refused up front, not cut off mid-stream.
    no_room = {
        "model": MODEL_NAME,
        "prompt": "a " * (CONTEXT // 2),
        "max_tokens": CONTEXT // 2 + 10,
        "stream": stream,
        "temperature": 0,
    }
    _assert_openai_error(_post(swarm, base_url, "/v1/completions", json=no_room), 400, "context_length_exceeded")
    assert time.monotonic() - started < 2.0
    assert active_sessions(addresses, swarm.security) == [0] * len(addresses)
    fits = {"model": MODEL_NAME, "prompt": "a " * (CONTEXT // 2), "max_tokens": 16, "temperature": 0}
    assert _post(swarm, base_url, "/v1/completions", json=fits).status_code == 200


def test_burst_admits_exactly_max_in_flight(swarm: Swarm, base_url: str) -> None:
    statuses: list[tuple[int, httpx.Headers, bytes]] = []
    readers: list[Iterator[str]] = []
    lock = threading.Lock()
    all_answered = threading.Event()
    go = threading.Barrier(BURST)

    def one_request(stack: ExitStack) -> None:
        client = stack.enter_context(httpx.Client(timeout=30, headers=swarm.auth))
        go.wait()
        response = stack.enter_context(
            client.stream("POST", base_url + "/v1/chat/completions", json=chat_body(SLOW_MAX_TOKENS))
        )
        if response.status_code == 200:
            # Keep the line iterator alive: collecting it would close the connection early.
            lines = response.iter_lines()
            readers.append(lines)
            first = next(line for line in lines if line.startswith("data: ")).encode()
        else:
            first = response.read()
        with lock:
            statuses.append((response.status_code, response.headers, first))
            if len(statuses) == BURST:
                all_answered.set()
        # Admitted streams stay open (unread) until every answer is in, so they stay in flight.
        all_answered.wait(timeout=20)

    with ExitStack() as stack:
        threads = [threading.Thread(target=one_request, args=(stack,)) for _ in range(BURST)]
        for thread in threads:
            thread.start()
        assert all_answered.wait(timeout=20), f"only {len(statuses)} of {BURST} answered"
        health = httpx.get(base_url + "/health", timeout=5).json()
        for thread in threads:
            thread.join(timeout=20)
        codes = sorted(status for status, _, _ in statuses)
        assert codes == [200] * MAX_IN_FLIGHT + [503] * (BURST - MAX_IN_FLIGHT), codes
        assert health["in_flight"] == MAX_IN_FLIGHT and health["capacity"] == MAX_IN_FLIGHT
        for status, headers, body in statuses:
            if status == 200:
                assert body.startswith(b'data: {"id":'), body  # admitted and streaming
            else:
                assert headers.get("retry-after") in ("1", "2")  # the 1 s floor, jittered
                assert httpx.Response(503, content=body).json()["error"]["code"] == "overloaded"
    # Closing the admitted streams cancels their routes: slots and worker sessions come back.
    wait_sessions_freed([w.address for w in swarm.live_workers()], within_s=2.0, security=swarm.security)
    deadline = time.monotonic() + 2.0
    while httpx.get(base_url + "/health", timeout=5).json()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert httpx.get(base_url + "/health", timeout=5).json()["in_flight"] == 0
    assert _post(swarm, base_url, "/v1/chat/completions", json=chat_body(4, stream=False)).status_code == 200
