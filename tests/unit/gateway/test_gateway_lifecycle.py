"""Request lifecycle on a real uvicorn server: a client that disconnects cancels its route
session (the double sees its iterator closed), admission admits exactly the cap under a burst
and answers the rest 503 + Retry-After at once (H3), and every slot comes back afterwards.

The route behind the app is the scripted double of ``gateway_doubles``, which cannot show a real
route (its docstring says what it cannot show). That a client going away frees real sessions on
real workers: tests/integration/test_swarm_admission.py and tests/model/test_lab_real.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
from gateway_doubles import MODEL, Script, ScriptedGenerator, live_server, make_app, wait_until

from meshnet.gateway.server import GatewayServer, serve_gateway

pytestmark = pytest.mark.timeout(30)

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "max_tokens": 200}


async def test_disconnect_mid_stream_closes_the_route_iterator() -> None:
    generator = ScriptedGenerator(Script(text="z" * 200, token_delay=0.01))
    app = make_app(generator)
    async with live_server(app) as base, httpx.AsyncClient(timeout=10) as http:
        url, body = f"{base}/v1/chat/completions", {**BODY, "stream": True}
        async with http.stream("POST", url, json=body) as response:
            request_id = response.headers["x-request-id"]
            received = 0
            async for line in response.aiter_lines():
                if line.startswith("data: ") and '"content":"z"' in line:
                    received += 1
                if received == 5:
                    break
        # Leaving the block closes the connection with the body unread: a client disconnect.
        closed_at = time.monotonic()
        await wait_until(lambda: request_id in generator.endings)
        latency = time.monotonic() - closed_at
        health = (await http.get(f"{base}/health")).json()
        snapshot = (await http.get(f"{base}/v1/telemetry/{request_id}")).json()
    assert generator.endings[request_id] in ("aclose", "cancelled")
    assert generator.tokens_sent[request_id] < 50  # stopped well before the 200 it would send
    assert latency < 0.5  # W5: freed within 500 ms
    assert health["in_flight"] == 0
    assert snapshot["state"] == "failed" and snapshot["error"]["code"] == "cancelled"


async def test_keepalives_fill_a_silent_route_and_items_keep_their_order() -> None:
    gate = asyncio.Event()
    generator = ScriptedGenerator(Script(text="abcdef", gate=gate, gate_after_tokens=3))
    app = make_app(generator, keepalive_seconds=0.02)
    lines: list[str] = []
    async with live_server(app) as base, httpx.AsyncClient(timeout=10) as http:
        url, body = f"{base}/v1/chat/completions", {**BODY, "stream": True}
        async with http.stream("POST", url, json=body) as response:
            async for line in response.aiter_lines():
                lines.append(line)
                if lines.count(": keep-alive") == 3:
                    gate.set()  # the route was silent for three keep-alive periods: let it go on
    texts = [json.loads(line[6:])["choices"][0]["delta"].get("content", "") for line in lines if '"delta"' in line]
    assert "".join(texts) == "abcdef"
    waiting = [i for i, line in enumerate(lines) if line == ": keep-alive"]
    content = [i for i, line in enumerate(lines) if '"content":"' in line and '"content":""' not in line]
    # Only while the route was silent: after the third token's text, before the fourth's.
    assert content[2] < waiting[0] and waiting[-1] < content[3], (content, waiting)
    assert [line for line in lines if line][-1] == "data: [DONE]"


async def test_disconnect_during_non_streaming_request_cancels_it() -> None:
    generator = ScriptedGenerator(Script(text="z" * 200, token_delay=0.01))
    async with live_server(make_app(generator)) as base:
        async with httpx.AsyncClient(timeout=10) as http:
            task = asyncio.create_task(http.post(f"{base}/v1/chat/completions", json=BODY))
            await wait_until(lambda: sum(generator.tokens_sent.values()) >= 3)
            task.cancel()  # the client gives up: its connection is dropped
            with pytest.raises(asyncio.CancelledError):
                await task
        await wait_until(lambda: len(generator.endings) == 1)
        async with httpx.AsyncClient() as http:
            health = (await http.get(f"{base}/health")).json()
    assert list(generator.endings.values()) == ["cancelled"]
    assert max(generator.tokens_sent.values()) < 50
    assert health["in_flight"] == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_burst_of_cap_plus_five_admits_exactly_cap(stream: bool) -> None:
    cap = 4
    gate = asyncio.Event()
    generator = ScriptedGenerator(Script(gate=gate))
    app = make_app(generator, max_in_flight=cap, retry_after_seconds=2)
    limits = httpx.Limits(max_connections=cap + 10)
    async with live_server(app) as base, httpx.AsyncClient(timeout=10, limits=limits) as http:

        async def one() -> httpx.Response:
            return await http.post(f"{base}/v1/chat/completions", json={**BODY, "stream": stream})

        tasks = [asyncio.create_task(one()) for _ in range(cap + 5)]
        # The admitted ones hold their slots at the gate; the rest must come back by themselves.
        await wait_until(lambda: sum(task.done() for task in tasks) == 5)
        rejected = [task.result() for task in tasks if task.done()]
        assert len(generator.requests) == cap
        gate.set()
        responses = await asyncio.gather(*tasks)
        health = (await http.get(f"{base}/health")).json()
    statuses = sorted(response.status_code for response in responses)
    assert statuses == [200] * cap + [503] * 5
    for response in rejected:
        assert response.status_code == 503
        assert 2 <= int(response.headers["retry-after"]) <= 4  # the floor, jittered up to twice it
        assert response.json()["error"]["code"] == "overloaded"
    assert health["in_flight"] == 0
    assert set(generator.endings.values()) == {"finished"}


async def test_slots_return_after_mixed_outcomes() -> None:
    from meshnet.core.errors import Unavailable

    generator = ScriptedGenerator()
    app = make_app(generator, max_in_flight=1)
    async with live_server(app) as base, httpx.AsyncClient(timeout=10) as http:
        url = f"{base}/v1/chat/completions"
        for script in (
            Script(),
            Script(fail_before=Unavailable("gone")),
            Script(fail_after_tokens=2, failure=Unavailable("gone")),
            Script(),
        ):
            generator.script = script
            for stream in (False, True):
                response = await http.post(url, json={**BODY, "stream": stream})
                assert response.status_code != 503 or "gone" in response.text
        assert (await http.get(f"{base}/health")).json()["in_flight"] == 0


async def test_graceful_stop_lets_an_in_flight_stream_finish() -> None:
    generator = ScriptedGenerator(Script(text="y" * 20, token_delay=0.01))
    server = GatewayServer(make_app(generator), "127.0.0.1", 0, shutdown_grace_seconds=5)
    port = await server.start()
    async with httpx.AsyncClient(timeout=10) as http:
        url, body = f"http://127.0.0.1:{port}/v1/chat/completions", {**BODY, "stream": True}
        async with http.stream("POST", url, json=body) as response:
            await wait_until(lambda: sum(generator.tokens_sent.values()) >= 2)
            stopping = asyncio.create_task(server.stop())
            text = (await response.aread()).decode()
        await stopping
    assert text.rstrip().endswith("data: [DONE]")
    assert list(generator.endings.values()) == ["finished"]


async def test_serve_gateway_stops_when_cancelled() -> None:
    with socket.socket() as probe:  # find a free loopback port for the fixed-port API
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    task = asyncio.create_task(
        serve_gateway(make_app(ScriptedGenerator()), "127.0.0.1", port, shutdown_grace_seconds=1)
    )
    async with httpx.AsyncClient(timeout=5) as http:
        for _ in range(200):
            try:
                health = await http.get(f"http://127.0.0.1:{port}/health")
                break
            except httpx.ConnectError:
                await asyncio.sleep(0.01)
    assert health.json()["status"] == "ok"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=5)
    async with httpx.AsyncClient(timeout=5) as http:
        with pytest.raises(httpx.ConnectError):  # no longer listening
            await http.get(f"http://127.0.0.1:{port}/health")
