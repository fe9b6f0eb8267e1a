"""Errors: every bad input is a 4xx OpenAI-style error (never a 500), each typed route failure
maps to its status before the first byte and to an SSE error event + [DONE] after it, and the
per-request deadline gives 504 or a streamed timeout (H2 and the status contract).

The route behind the app is the scripted double of ``gateway_doubles``, which cannot show a real
route (its docstring says what it cannot show). Failures of real routes:
tests/integration/test_swarm_failover.py (a killed worker: failover or worker_lost) and
test_swarm_admission.py (bad input refused before any worker).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from gateway_doubles import MODEL, ByteCodec, Script, ScriptedGenerator, make_app, parse_raw_sse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshnet.core.errors import (
    CacheMiss,
    DeadlineExceeded,
    EngineError,
    IntegrityError,
    InvalidArgument,
    MeshnetError,
    NoRoute,
    ResourceExhausted,
    RouteStale,
    TrackerBusy,
    Unavailable,
)

pytestmark = pytest.mark.timeout(60)

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def client() -> Iterator[TestClient]:
    app = make_app(ScriptedGenerator(), ByteCodec(context_length=64), max_tokens_limit=1000)
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": USER, **fields}


BAD_CHAT_BODIES: dict[str, tuple[Any, int, str | None]] = {
    # name: (body, status, code) -- a str body is sent raw, as bytes
    "truncated json": ('{"model": "tiny-test", "messages": [', 400, "invalid_json"),
    "empty body": ("", 400, "invalid_json"),
    "not utf-8": ("\udcff", 400, "invalid_json"),
    "array body": ([1, 2], 400, "invalid_parameter"),
    "missing model": ({"messages": USER}, 400, "missing_required_parameter"),
    "missing messages": ({"model": MODEL}, 400, "missing_required_parameter"),
    "empty messages": (chat(messages=[]), 400, "invalid_parameter"),
    "messages as string": (chat(messages="hi"), 400, "invalid_parameter"),
    "message not object": (chat(messages=["hi"]), 400, "invalid_parameter"),
    "bad role": (chat(messages=[{"role": "robot", "content": "x"}]), 400, "invalid_parameter"),
    "model as number": (chat(model=5), 400, "invalid_parameter"),
    "temperature as string": (chat(temperature="0.5"), 400, "invalid_parameter"),
    "max_tokens as string": (chat(max_tokens="10"), 400, "invalid_parameter"),
    "max_tokens as bool": (chat(max_tokens=True), 400, "invalid_parameter"),
    "max_tokens float": (chat(max_tokens=1.5), 400, "invalid_parameter"),
    "stream as string": (chat(stream="yes"), 400, "invalid_parameter"),
    "stop as number": (chat(stop=3), 400, "invalid_parameter"),
    "unknown model": (chat(model="gpt-9"), 404, "model_not_found"),
    "huge max_tokens": (chat(max_tokens=10**12), 400, "invalid_parameter"),
    "zero max_tokens": (chat(max_tokens=0), 400, "invalid_parameter"),
    "negative max_tokens": (chat(max_tokens=-5), 400, "invalid_parameter"),
    "prompt over cap": (chat(messages=[{"role": "user", "content": "x" * 80}]), 400, "context_length_exceeded"),
    "prompt + max_tokens over cap": (chat(max_tokens=60), 400, "context_length_exceeded"),
    "temperature below 0": (chat(temperature=-0.1), 400, "invalid_parameter"),
    "temperature above 2": (chat(temperature=2.5), 400, "invalid_parameter"),
    "top_p zero": (chat(top_p=0), 400, "invalid_parameter"),
    "top_p above 1": (chat(top_p=1.5), 400, "invalid_parameter"),
    "top_k negative": (chat(top_k=-1), 400, "invalid_parameter"),
    "seed too large": (chat(seed=2**70), 400, "invalid_parameter"),
    "n above the limit": (chat(n=9), 400, "invalid_parameter"),
    "n zero": (chat(n=0), 400, "invalid_parameter"),
    "logprobs as string": (chat(logprobs="yes"), 400, "invalid_parameter"),
    "top_logprobs without logprobs": (chat(top_logprobs=3), 400, "invalid_parameter"),
    "top_logprobs above 20": (chat(logprobs=True, top_logprobs=21), 400, "invalid_parameter"),
    "tool_choice naming no tool": (
        chat(
            tools=[{"type": "function", "function": {"name": "f"}}],
            tool_choice={"type": "function", "function": {"name": "g"}},
        ),
        400,
        "invalid_parameter",
    ),
    "tools not a list": (chat(tools={"name": "f"}), 400, "invalid_parameter"),
    "legacy functions": (chat(functions=[{"name": "f"}]), 400, "unsupported_parameter"),
    "unknown response_format": (chat(response_format={"type": "yaml"}), 400, "invalid_parameter"),
    "json_schema without schema": (chat(response_format={"type": "json_schema"}), 400, "invalid_parameter"),
    "unusable json_schema": (
        chat(response_format={"type": "json_schema", "json_schema": {"schema": {"$ref": "https://x.test/s"}}}),
        400,
        "invalid_argument",
    ),
    "penalty above 2": (chat(frequency_penalty=2.5), 400, "invalid_parameter"),
    "presence penalty below -2": (chat(presence_penalty=-3), 400, "invalid_parameter"),
    "logit_bias key not an id": (chat(logit_bias={"abc": 10}), 400, "invalid_parameter"),
    "logit_bias id outside vocab": (chat(logit_bias={"99999": 10}), 400, "invalid_parameter"),
    "logit_bias above 100": (chat(logit_bias={"5": 101}), 400, "invalid_argument"),
    "tool message answering no call": (chat(messages=[{"role": "tool", "content": "x"}]), 400, "invalid_parameter"),
    "image part": (
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]),
        400,
        "unsupported_parameter",
    ),
    "too many stops": (chat(stop=["a", "b", "c", "d", "e"]), 400, "invalid_parameter"),
    "min_p above 1": (chat(min_p=1.5), 400, "invalid_parameter"),
    "min_p negative": (chat(min_p=-0.1), 400, "invalid_parameter"),
    "min_p as string": (chat(min_p="0.1"), 400, "invalid_parameter"),
    "repetition_penalty zero": (chat(repetition_penalty=0.0), 400, "invalid_parameter"),
    "repetition_penalty negative": (chat(repetition_penalty=-1.2), 400, "invalid_parameter"),
    "repetition_penalty huge": (chat(repetition_penalty=1e9), 400, "invalid_parameter"),
    "empty stop": (chat(stop=""), 400, "invalid_parameter"),
}

BAD_TEXT_BODIES: dict[str, tuple[Any, int, str | None]] = {
    "missing prompt": ({"model": MODEL}, 400, "missing_required_parameter"),
    "prompt as object": ({"model": MODEL, "prompt": {"a": 1}}, 400, "invalid_parameter"),
    "batched prompt": ({"model": MODEL, "prompt": ["a", "b"]}, 400, "unsupported_parameter"),
    "negative token id": ({"model": MODEL, "prompt": [5, -1]}, 400, "invalid_parameter"),
    "best_of": ({"model": MODEL, "prompt": "a", "best_of": 3}, 400, "unsupported_parameter"),
    "echo": ({"model": MODEL, "prompt": "a", "echo": True}, 400, "unsupported_parameter"),
    "suffix": ({"model": MODEL, "prompt": "a", "suffix": "z"}, 400, "unsupported_parameter"),
    "logprobs above 20": ({"model": MODEL, "prompt": "a", "logprobs": 21}, 400, "invalid_parameter"),
    "logprobs as bool": ({"model": MODEL, "prompt": "a", "logprobs": True}, 400, "invalid_parameter"),
    "min_p above 1": ({"model": MODEL, "prompt": "a", "min_p": 2}, 400, "invalid_parameter"),
    "repetition_penalty zero": ({"model": MODEL, "prompt": "a", "repetition_penalty": 0}, 400, "invalid_parameter"),
    "prompt over cap": ({"model": MODEL, "prompt": "y" * 64}, 400, "context_length_exceeded"),
}


def post(client: TestClient, path: str, body: Any) -> Any:
    if isinstance(body, str):
        raw = body.encode("utf-8", errors="surrogateescape")
        return client.post(path, content=raw, headers={"content-type": "application/json"})
    return client.post(path, json=body)


def assert_openai_error(response: Any, status: int, code: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code", "param"}
    assert error["message"]
    if code is not None:
        assert error["code"] == code
    assert response.headers["x-request-id"].startswith("req-")
    return error


@pytest.mark.parametrize("name", list(BAD_CHAT_BODIES))
def test_bad_chat_input_is_an_openai_4xx(client: TestClient, name: str) -> None:
    body, status, code = BAD_CHAT_BODIES[name]
    assert_openai_error(post(client, CHAT, body), status, code)


@pytest.mark.parametrize("name", list(BAD_TEXT_BODIES))
def test_bad_text_input_is_an_openai_4xx(client: TestClient, name: str) -> None:
    body, status, code = BAD_TEXT_BODIES[name]
    assert_openai_error(post(client, TEXT, body), status, code)


def test_errors_name_the_offending_parameter(client: TestClient) -> None:
    assert assert_openai_error(post(client, CHAT, chat(top_p=3)), 400, None)["param"] == "top_p"
    error = assert_openai_error(post(client, CHAT, chat(top_logprobs=2)), 400, None)
    assert error["param"] == "top_logprobs"
    error = assert_openai_error(post(client, CHAT, chat(logit_bias={"x": 1})), 400, None)
    assert error["param"] == "logit_bias"
    assert assert_openai_error(post(client, CHAT, chat(min_p=3)), 400, None)["param"] == "min_p"
    error = assert_openai_error(post(client, CHAT, chat(repetition_penalty=0)), 400, None)
    assert error["param"] == "repetition_penalty"


def test_body_over_the_size_limit_is_413() -> None:
    app = make_app(ScriptedGenerator(), max_body_bytes=1000)
    with TestClient(app) as small:
        body = chat(messages=[{"role": "user", "content": "z" * 2000}])
        assert_openai_error(small.post(CHAT, json=body), 413, "request_too_large")


def test_unknown_route_and_method_are_openai_errors(client: TestClient) -> None:
    assert_openai_error(client.get("/v1/nothing"), 404, "not_found")
    assert_openai_error(client.get(CHAT), 405, "method_not_allowed")


@pytest.mark.parametrize(
    "body",
    [
        chat(
            user="alice",
            metadata={"k": "v"},
            store=False,
            n=1,
            logprobs=False,
            response_format={"type": "text"},
            frequency_penalty=0,
            tools=[],
            some_future_field=1,
        ),
        chat(
            messages=[
                {"role": "developer", "content": "x"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": None},
            ],
            max_completion_tokens=3,
        ),
    ],
)
def test_harmless_openai_fields_are_accepted(client: TestClient, body: dict[str, Any]) -> None:
    response = client.post(CHAT, json=body)
    assert response.status_code == 200, response.text


def test_token_id_prompts_are_accepted(client: TestClient) -> None:
    for prompt in ([5, 6, 7], [[5, 6, 7]], ["abc"]):
        response = client.post(TEXT, json={"model": MODEL, "prompt": prompt})
        assert response.status_code == 200, response.text


FAILURES: list[tuple[BaseException, int, str]] = [
    (InvalidArgument("bad tensor bundle"), 400, "invalid_argument"),
    (NoRoute("no shard serves layers 12:24"), 503, "no_route"),
    (Unavailable("node-b is gone"), 503, "worker_lost"),
    (ResourceExhausted("KV budget full"), 503, "overloaded"),
    (RouteStale("epoch 3 < 4"), 503, "route_stale"),
    (CacheMiss("session evicted"), 503, "cache_miss"),
    (DeadlineExceeded("too slow"), 504, "timeout"),
    (IntegrityError("checksum mismatch"), 502, "integrity_error"),
    (EngineError("llama_decode returned 1"), 502, "engine_error"),
    (RuntimeError("a bug in the route driver"), 500, "internal"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("failure", "status", "code"), FAILURES, ids=lambda v: str(v)[:20])
def test_failure_before_first_byte_maps_to_status(failure: BaseException, status: int, code: str, stream: bool) -> None:
    generator = ScriptedGenerator(Script(fail_before=failure))
    with TestClient(make_app(generator), raise_server_exceptions=False) as test_client:
        response = test_client.post(CHAT, json=chat(stream=stream))
        error = assert_openai_error(response, status, code)
        if isinstance(failure, MeshnetError):
            assert error["message"] == failure.message
        retry_after = response.headers.get("retry-after")
        assert (retry_after is not None) == (status == 503)
        assert test_client.get("/health").json()["in_flight"] == 0


@pytest.mark.parametrize(("failure", "status", "code"), FAILURES, ids=lambda v: str(v)[:20])
def test_failure_after_first_byte_is_a_streamed_error_then_done(failure: BaseException, status: int, code: str) -> None:
    generator = ScriptedGenerator(Script(fail_after_tokens=4, failure=failure))
    with TestClient(make_app(generator), raise_server_exceptions=False) as test_client:
        response = test_client.post(CHAT, json=chat(stream=True))
        assert response.status_code == 200
        raw = parse_raw_sse(response.text)
        assert raw.data[-1] == "[DONE]"
        error = json.loads(raw.data[-2])["error"]
        request_id = response.headers["x-request-id"]
        retryable = isinstance(failure, MeshnetError) and failure.retryable
        assert error["code"] == code and error["request_id"] == request_id
        assert error["retryable"] is retryable
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in raw.chunks[:-1])
        assert text == "Hell"
        assert test_client.get("/health").json()["in_flight"] == 0


def test_deadline_gives_504_or_a_streamed_timeout() -> None:
    slow = Script(text="slow " * 20, token_delay=0.05)
    generator = ScriptedGenerator(slow)
    app = make_app(generator, request_timeout_seconds=0.3)
    with TestClient(app) as test_client:
        whole = test_client.post(CHAT, json=chat())
        assert_openai_error(whole, 504, "timeout")
        streamed = test_client.post(CHAT, json=chat(stream=True))
    raw = parse_raw_sse(streamed.text)
    assert json.loads(raw.data[-2])["error"]["code"] == "timeout"
    assert raw.data[-1] == "[DONE]"
    # The deadline cancelled the route mid-token: its iterator was interrupted, not finished.
    assert set(generator.endings.values()) == {"cancelled"}
    assert all(0 < sent < 10 for sent in generator.tokens_sent.values())


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
FIELD_NAMES = st.sampled_from(
    [
        "model",
        "messages",
        "prompt",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "stream",
        "n",
        "logprobs",
        "tools",
        "response_format",
        "stream_options",
        "user",
        "echo",
    ]
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]), "content": JSON_VALUES}
)
BODIES = st.one_of(
    JSON_VALUES,
    st.dictionaries(FIELD_NAMES, JSON_VALUES, max_size=6),
    st.fixed_dictionaries(
        {"model": st.sampled_from([MODEL, "other"]), "messages": st.lists(MESSAGE, max_size=3)},
        optional={name: JSON_VALUES for name in ("max_tokens", "temperature", "stop", "stream")},
    ),
    st.fixed_dictionaries(
        {"model": st.just(MODEL), "prompt": JSON_VALUES},
        optional={"max_tokens": st.integers(), "top_p": st.floats(), "stream": st.booleans()},
    ),
)


def test_random_json_bodies_never_cause_a_500(client: TestClient) -> None:
    @settings(
        max_examples=300,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(path=st.sampled_from([CHAT, TEXT]), body=BODIES)
    def check(path: str, body: Any) -> None:
        response = client.post(path, content=json.dumps(body).encode())
        assert response.status_code < 500, (body, response.text)
        if response.status_code >= 400:
            assert "message" in response.json()["error"]

    check()


def test_random_bytes_never_cause_a_500(client: TestClient) -> None:
    @settings(max_examples=100, deadline=None, derandomize=True)
    @given(raw=st.binary(max_size=64))
    def check(raw: bytes) -> None:
        response = client.post(CHAT, content=raw)
        assert 400 <= response.status_code < 500

    check()


@pytest.mark.parametrize("stream", [False, True])
def test_a_route_the_tracker_shed_is_retried_after_its_hint(stream: bool) -> None:
    """A 503 for ``TrackerBusy`` carries the tracker's retry hint (rounded up), not the gateway's
    default, so clients back off as long as the tracker asked."""
    generator = ScriptedGenerator(Script(fail_before=TrackerBusy("tracker behind on its work", 7.2)))
    with TestClient(make_app(generator), raise_server_exceptions=False) as test_client:
        response = test_client.post(CHAT, json=chat(stream=stream))
        assert_openai_error(response, 503, "tracker_busy")
        assert response.headers["retry-after"] == "8"
