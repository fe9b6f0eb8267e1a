"""The admission queue: FIFO places with a deadline, 503 beyond the bound with a spread
Retry-After, telemetry of the wait, and limits derived from the swarm's slots when unset.

Order is shown by waiting on the state it leads to (``wait_until``) or by letting woken tasks
take their next step (``settle``), and time by injected clocks, never by sleeping. The apps
run over the scripted route of ``gateway_doubles`` (see its docstring for what it cannot show);
the queue under real load is test_gateway_queue_load.py's.
"""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest
from gateway_doubles import MODEL, Script, ScriptedGenerator, live_server, make_app, parse_raw_sse
from manual_clock import ManualClock

from meshnet.gateway.admission import Admission, Refused
from meshnet.gateway.config import GatewayConfig, admission_limits

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def wait_until(condition, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def settle() -> None:
    """Let every task woken so far run up to its next await; no time passes."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_waiters_are_admitted_in_order_as_slots_free() -> None:
    admission = Admission(1, 3, clock=asyncio.get_running_loop().time, rng=random.Random(0))
    first = await admission.acquire(1.0, lambda position: None)
    positions: list[int] = []
    waiting = [asyncio.create_task(admission.acquire(5.0, positions.append)) for _ in range(3)]
    await wait_until(lambda: admission.queued == 3)
    assert positions == [1, 2, 3]
    with pytest.raises(Refused):  # the bound: refused at once, not queued
        await admission.acquire(5.0, positions.append)
    first.release()
    lease = await waiting[0]
    assert not waiting[1].done() and lease.waited_s > 0
    lease.release()
    (await waiting[1]).release()
    (await waiting[2]).release()
    assert (admission.in_flight, admission.queued, admission.rejected) == (0, 0, 1)


async def test_a_place_times_out_and_a_cancelled_waiter_leaves_no_trace() -> None:
    admission = Admission(1, 2, clock=asyncio.get_running_loop().time, rng=random.Random(0))
    held = await admission.acquire(1.0, lambda position: None)
    with pytest.raises(Refused, match=r"within 0\.05 s"):
        await admission.acquire(0.05, lambda position: None)
    gone = asyncio.create_task(admission.acquire(5.0, lambda position: None))
    await wait_until(lambda: admission.queued == 1)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert admission.queued == 0 and admission.timed_out == 1
    held.release()
    assert admission.in_flight == 0  # the slot was not handed to the waiter that left


async def test_background_work_takes_a_slot_only_when_no_request_waits_and_never_overtakes() -> None:
    admission = Admission(1, 2, clock=asyncio.get_running_loop().time, rng=random.Random(0))
    user = await admission.acquire(1.0, lambda position: None)
    waiting = asyncio.create_task(admission.acquire(5.0, lambda position: None))
    await wait_until(lambda: admission.queued == 1)
    audit = asyncio.create_task(admission.spare_slot())
    user.release()
    second = await waiting  # the queued request goes first
    await settle()  # the audit, woken by the release too, looked again and found no slot
    assert not audit.done() and admission.in_flight == 1
    second.release()
    background = await audit
    assert admission.in_flight == 1
    # A request arriving while background work holds the slot waits behind it, not refused.
    late = asyncio.create_task(admission.acquire(5.0, lambda position: None))
    await wait_until(lambda: admission.queued == 1)
    background.release()
    (await late).release()
    assert (admission.in_flight, admission.queued, admission.rejected) == (0, 0, 0)


async def test_a_cancelled_background_wait_leaves_no_trace() -> None:
    admission = Admission(1, 2, clock=asyncio.get_running_loop().time, rng=random.Random(0))
    user = await admission.acquire(1.0, lambda position: None)
    audit = asyncio.create_task(admission.spare_slot())
    await settle()
    assert not audit.done()  # waiting for a spare slot
    audit.cancel()
    with pytest.raises(asyncio.CancelledError):
        await audit
    user.release()
    assert admission.in_flight == 0


def test_retry_after_is_spread_and_repeatable_given_a_seed() -> None:
    now = [0.0]

    def refusals(seed: int) -> list[int]:
        admission = Admission(1, 0, clock=lambda: now[0], rng=random.Random(seed))
        for at in (0.0, 1.0, 2.0, 3.0):  # four completions over 3 s: ~1.3 per second
            now[0] = at
            admission._in_flight = 1
            admission._return_slot()
        return [admission.retry_after() for _ in range(50)]

    values = refusals(7)
    assert values == refusals(7)
    assert len(set(values)) >= 2, "every refused client told the same moment"
    assert min(values) >= 1 and max(values) <= 2 * max(1, min(values)) + 1


def test_limits_follow_the_swarm_unless_configured() -> None:
    assert admission_limits(GatewayConfig(), None) == (8, 64)
    assert admission_limits(GatewayConfig(), 3) == (3, 24)
    assert admission_limits(GatewayConfig(max_in_flight=2, max_queue=5), 40) == (2, 5)
    # Derived limits never outgrow the telemetry hub, which must hold every admitted and waiting request.
    assert admission_limits(GatewayConfig(telemetry_max_requests=20), 8) == (8, 11)


async def test_queued_requests_stream_after_the_busy_one_with_wait_in_telemetry() -> None:
    gate = asyncio.Event()
    generator = ScriptedGenerator(Script(gate=gate, gate_after_tokens=1))
    app = make_app(generator, max_in_flight=1, max_queue=2, queue_timeout_seconds=5.0)
    async with live_server(app) as base, httpx.AsyncClient(timeout=10) as http:
        url = f"{base}/v1/chat/completions"
        tasks = [asyncio.create_task(http.post(url, json=BODY))]
        await wait_until(lambda: len(generator.requests) == 1)
        tasks += [asyncio.create_task(http.post(url, json=BODY)) for _ in range(2)]
        await wait_until(lambda: app.state.admission.queued == 2)
        refused = await http.post(url, json=BODY)
        gate.set()
        responses = await asyncio.gather(*tasks)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "overloaded"
    assert int(refused.headers["retry-after"]) >= 1
    streams = [parse_raw_sse(response.text) for response in responses]
    assert [response.status_code for response in responses] == [200, 200, 200]
    texts = {
        "".join(c["choices"][0]["delta"].get("content", "") for c in s.chunks if c.get("choices")) for s in streams
    }
    assert texts == {"Hello world"}
    kinds = [[event["kind"] for event in stream.telemetry][:2] for stream in streams]
    assert kinds == [["accepted", "prefill_started"], ["queued", "accepted"], ["queued", "accepted"]]
    positions = sorted(stream.telemetry[0]["position"] for stream in streams[1:])
    assert positions == [1, 2]
    waits = [stream.telemetry[1]["queue_seconds"] for stream in streams[1:]]
    assert all(wait > 0 for wait in waits)


async def test_unset_limits_are_read_from_the_swarm_and_follow_it() -> None:
    generator, clock = ScriptedGenerator(slots=3), ManualClock()
    app = make_app(
        generator,
        clock=clock,
        max_in_flight=None,
        max_queue=None,
        telemetry_max_requests=64,
        capacity_refresh_seconds=30.0,
    )
    admission = app.state.admission
    async with live_server(app) as base, httpx.AsyncClient(timeout=10) as http:
        url, body = f"{base}/v1/chat/completions", {**BODY, "stream": False}
        assert (await http.post(url, json=body)).status_code == 200
        health = (await http.get(f"{base}/health")).json()
        assert (health["capacity"], health["queue_limit"]) == (3, 24)
        generator.slots = 5  # a worker joined
        assert (await http.post(url, json=body)).status_code == 200
        await settle()
        assert admission.capacity == 3  # the limits are fresh for 30 s: nobody asked the tracker
        clock.now += 30.0
        assert (await http.post(url, json=body)).status_code == 200
        await wait_until(lambda: admission.capacity == 5)
    assert admission.queue_limit == 40


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_out_of_vocabulary_token_ids_are_a_400_before_any_stream(stream: bool) -> None:
    generator = ScriptedGenerator()
    app = make_app(generator)
    vocab = 256 + 2  # ByteCodec
    async with live_server(app) as base, httpx.AsyncClient(timeout=10) as http:
        for prompt in ([5, vocab], [[7, vocab + 1000]], [-1]):
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "stream": stream}
            response = await http.post(f"{base}/v1/completions", json=body)
            assert response.status_code == 400, response.text
            assert response.json()["error"]["param"] == "prompt"
        ok = await http.post(
            f"{base}/v1/completions", json={"model": MODEL, "prompt": [5, vocab - 1], "stream": stream}
        )
        assert ok.status_code == 200
    assert len(generator.requests) == 1  # the bad ones never reached a route
