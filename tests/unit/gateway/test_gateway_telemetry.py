"""Generation Telemetry: order and rising counts in the completion stream (as a raw SSE parser
reads it), the polling snapshot, the separate events stream, and the hub's bounds.

The route behind the app is the scripted double of ``gateway_doubles``, which cannot show a real
route (its docstring says what it cannot show). Telemetry of real routes (raw stream, polling,
replay): tests/integration/test_swarm_openai.py and test_prefill_progress.py.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from gateway_doubles import (
    MODEL,
    Script,
    ScriptedGenerator,
    live_server,
    make_app,
    parse_raw_sse,
    wait_until,
)

from meshnet.core.ids import RequestId
from meshnet.core.tracking import billing_units
from meshnet.gateway.telemetry_hub import TelemetryHub

pytestmark = pytest.mark.timeout(30)

LONG_TEXT = "The quick brown fox jumps"  # 25 tokens + EOS
EXPECTED_KINDS = [
    "accepted",
    "prefill_started",
    "prefill_completed",
    "decode_started",
    "progress",
    "route_health",
    "progress",
    "progress",
    "progress",
    "progress",
    "progress",
    "completed",
]


def chat_body(stream: bool = True) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "stream": stream}


async def test_stream_interleaves_telemetry_in_order_with_rising_counts() -> None:
    generator = ScriptedGenerator(Script(text=LONG_TEXT, health_after_tokens=6))
    async with live_server(make_app(generator)) as base, httpx.AsyncClient() as http:
        response = await http.post(f"{base}/v1/chat/completions", json=chat_body())
    raw = parse_raw_sse(response.text)
    request_id = response.headers["x-request-id"]
    kinds = [event["kind"] for event in raw.telemetry]
    assert kinds == EXPECTED_KINDS
    assert [event["seq"] for event in raw.telemetry] == list(range(len(kinds)))
    assert {event["request_id"] for event in raw.telemetry} == {request_id}
    counts = [event["generated_tokens"] for event in raw.telemetry if event["kind"] == "progress"]
    assert counts == [4, 8, 12, 16, 20, 24]  # every 4 tokens (config), strictly rising
    rates = [event["tokens_per_second"] for event in raw.telemetry if event["kind"] == "progress"]
    assert rates == sorted(rates) and rates[0] > 0
    accepted = raw.telemetry[0]
    assert (accepted["model"], accepted["quantization"], accepted["session_id"]) == (
        MODEL,
        "Q8_0",
        "s-test",
    )
    assert [hop["layers"] for hop in accepted["hops"]] == ["0:12", "12:24"]  # type: ignore[index]
    completed = raw.telemetry[-1]
    prompt, _ = generator.requests[0]
    billed = billing_units(len(prompt.prompt_tokens), len(LONG_TEXT) + 1)
    assert completed["usage"]["billing_units"] == billed  # type: ignore[index]
    assert raw.data[-1] == "[DONE]"
    assert all(chunk["id"] == request_id for chunk in raw.chunks)


async def test_polling_snapshot_after_completion() -> None:
    generator = ScriptedGenerator(Script(text=LONG_TEXT, health_after_tokens=2))
    async with live_server(make_app(generator)) as base, httpx.AsyncClient() as http:
        response = await http.post(f"{base}/v1/chat/completions", json=chat_body(stream=False))
        request_id = response.headers["x-request-id"]
        assert response.json()["id"] == request_id
        snapshot = (await http.get(f"{base}/v1/telemetry/{request_id}")).json()
        missing = await http.get(f"{base}/v1/telemetry/req-unknown")
    assert snapshot["state"] == "completed" and snapshot["finished"] is True
    assert snapshot["generated_tokens"] == len(LONG_TEXT) + 1
    prompt, _ = generator.requests[0]
    assert snapshot["usage"]["billing_units"] == billing_units(len(prompt.prompt_tokens), len(LONG_TEXT) + 1)
    assert snapshot["route"]["epoch"] == 3
    note = {"status": "failover", "reason": "node-b lost; replayed onto node-c"}
    assert snapshot["health"] == [note]
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "telemetry_not_found"


async def test_separate_events_stream_follows_a_live_request() -> None:
    gate = asyncio.Event()
    generator = ScriptedGenerator(Script(text=LONG_TEXT, health_after_tokens=6, token_delay=0.002))
    app = make_app(generator)
    async with live_server(app) as base, httpx.AsyncClient(timeout=10) as http:
        # The route pauses after 5 tokens, so the follower attaches mid-request.
        generator.script.gate, generator.script.gate_after_tokens = gate, 5
        async with http.stream("POST", f"{base}/v1/chat/completions", json=chat_body()) as stream:
            request_id = stream.headers["x-request-id"]
            follow = asyncio.create_task(http.get(f"{base}/v1/telemetry/{request_id}/events"))
            await wait_until(lambda: generator.tokens_sent.get(request_id) == 5)
            polled = (await http.get(f"{base}/v1/telemetry/{request_id}")).json()
            gate.set()
            body = (await stream.aread()).decode()
        events_response = await follow
    assert polled["finished"] is False and polled["state"] == "decode_started"
    assert polled["generated_tokens"] == 4  # the last progress event, not a guess
    assert events_response.headers["content-type"].startswith("text/event-stream")
    followed = [
        json.loads(line[len("data: ") :]) for line in events_response.text.splitlines() if line.startswith("data: ")
    ]
    assert [event["kind"] for event in followed] == EXPECTED_KINDS
    assert "event: telemetry" in events_response.text
    # The same events, with the same sequence numbers, as the ones in the completion stream.
    assert followed == parse_raw_sse(body).telemetry


async def test_failed_request_ends_its_telemetry_with_the_error() -> None:
    from meshnet.core.errors import IntegrityError

    failure = IntegrityError("hidden state checksum mismatch at seam 12")
    generator = ScriptedGenerator(Script(fail_after_tokens=2, failure=failure))
    async with live_server(make_app(generator)) as base, httpx.AsyncClient() as http:
        response = await http.post(f"{base}/v1/chat/completions", json=chat_body())
        request_id = response.headers["x-request-id"]
        snapshot = (await http.get(f"{base}/v1/telemetry/{request_id}")).json()
    kinds = [event["kind"] for event in parse_raw_sse(response.text).telemetry]
    assert kinds[-1] == "failed"
    assert snapshot["state"] == "failed"
    assert snapshot["error"]["code"] == "integrity_error"


def _hub(max_requests: int = 3, max_events: int = 5) -> TelemetryHub:
    return TelemetryHub(max_requests=max_requests, max_events_per_request=max_events, clock=lambda: 0.0)


def test_hub_evicts_oldest_finished_first() -> None:
    hub = _hub()
    ids = [RequestId(f"req-{n}") for n in range(4)]
    for request_id in ids[:3]:
        hub.open(request_id, MODEL)
    hub.publish(ids[1], "completed", {"usage": {}})  # the only finished one
    hub.publish(ids[0], "accepted", {})
    hub.open(ids[3], MODEL)
    assert ids[1] not in hub
    assert all(request_id in hub for request_id in (ids[0], ids[2], ids[3]))
    assert len(hub) == 3


def test_hub_shows_and_counts_each_owner_its_own_requests() -> None:
    hub = _hub(max_requests=8)
    for request_id, owner, tokens in (("req-a", "key-a", 5), ("req-b", "key-b", 7), ("req-c", "key-a", 1)):
        hub.open(RequestId(request_id), MODEL, owner)
        hub.publish(RequestId(request_id), "completed", {"usage": {"prompt_tokens": tokens}})
    hub.open(RequestId("req-live"), MODEL, "key-b")
    shown = {snapshot.request_id for snapshot, _ in hub.recent(10, lambda owner: owner == "key-a")}
    assert shown == {"req-a", "req-c"}
    assert len(hub.recent(10)) == 4  # an admin's view: everything
    assert hub.totals_of("key-a") == {"requests_completed_total": 2.0, "prompt_tokens_total": 6.0}
    assert hub.totals_of("key-b")["prompt_tokens_total"] == 7.0 and hub.totals_of("key-new") == {}
    assert hub.totals["prompt_tokens_total"] == 13.0


def test_hub_keeps_milestones_when_dropping_progress() -> None:
    hub = _hub(max_events=5)
    request_id = RequestId("req-x")
    hub.open(request_id, MODEL)
    hub.publish(request_id, "accepted", {})
    hub.publish(request_id, "decode_started", {})
    for count in range(1, 8):
        hub.publish(request_id, "progress", {"generated_tokens": count, "tokens_per_second": 1.0})
    hub.publish(request_id, "completed", {"usage": {"completion_tokens": 7}})
    assert hub.publish(request_id, "progress", {}) is None  # nothing after the terminal event

    async def drain() -> list[str]:
        events = [event async for event in hub.follow(request_id)]
        return [f"{e.kind}:{e.data.get('generated_tokens', '')}" for e in events]

    kept = asyncio.run(drain())
    assert kept == ["accepted:", "decode_started:", "progress:6", "progress:7", "completed:"]
    snapshot = hub.snapshot(request_id)
    assert snapshot is not None and snapshot.generated_tokens == 7 and snapshot.finished
