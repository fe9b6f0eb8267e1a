"""What a route knows about its nodes, it knows from the tracker: no node is asked per request.

A live swarm (tracker, llama.cpp workers, gateway, all processes). Each worker counts the
GetCapability calls it answers (``capability_calls_total`` in GetMetrics): a chat completion
through the gateway must not add one, since every hop of the tracker's route carries its node's
capability. And a worker restarted at the same address with another ``--context`` is a new
record: the next request is sized by it, not by anything remembered about that address.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest
from swarm_harness import Swarm, chat_body

from meshnet.route.shard_admin import fetch_capability, fetch_metrics
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire.tls import LinkSecurity

pytestmark = pytest.mark.timeout(120)

SMALL_CONTEXT = 96
"""Fewer positions than the chat prompt plus ``LONG_ANSWER`` take (a worker measures its speed
over 80 at start-up, so it needs that many); the restarted worker holds 512."""
MAX_TOKENS = 24
LONG_ANSWER = 100


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory, model: Path) -> Iterator[Swarm]:
    with Swarm(tmp_path_factory.mktemp("swarm"), model) as running:
        running.start_tracker()
        running.start_workers("0:2", "2:4", "4:6")
        running.start_gateway()
        running.wait_routable(nodes=3)
        yield running


def capability_calls(addresses: Sequence[str], security: LinkSecurity | None) -> list[int]:
    async def ask() -> list[int]:
        pool = ChannelPool(4 << 20, security)
        try:
            answers = await asyncio.gather(*(fetch_metrics(pool, address, timeout_s=2.0) for address in addresses))
            return [int(values["capability_calls_total"]) for values in answers]
        finally:
            await pool.close()

    return asyncio.run(ask())


def chat(swarm: Swarm, base_url: str, max_tokens: int = MAX_TOKENS) -> httpx.Response:
    body = chat_body(max_tokens, stream=False)
    return httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=swarm.auth, timeout=30)


def test_a_chat_completion_asks_no_worker_for_its_capability(swarm: Swarm) -> None:
    base_url = swarm.gateways[0].ready_line.split()[3]
    addresses = [worker.address for worker in swarm.live_workers()]
    for _ in range(2):  # the first request of a gateway is where a cache would be filled
        response = chat(swarm, base_url)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] > 0
    # Nothing asked since the workers started: not the requests, their context checks, the
    # gateway's model listing, nor the workers' probes of each other (health checks).
    assert capability_calls(addresses, swarm.security) == [0, 0, 0]
    # The count is real: an admin call is counted where it lands.
    asyncio.run(_ask_capability(addresses[1], swarm.security))
    assert capability_calls(addresses, swarm.security) == [0, 1, 0]


async def _ask_capability(address: str, security: LinkSecurity | None) -> None:
    pool = ChannelPool(4 << 20, security)
    try:
        await fetch_capability(pool, address)
    finally:
        await pool.close()


def test_a_worker_restarted_with_another_context_is_sized_by_its_new_record(tmp_path: Path, model: Path) -> None:
    with Swarm(tmp_path, model) as swarm:
        swarm.start_tracker()
        (small,) = swarm.start_workers("0:6", n_ctx_per_session=SMALL_CONTEXT)
        base_url = swarm.start_gateway()
        swarm.wait_routable(nodes=1)
        refused = chat(swarm, base_url, LONG_ANSWER)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "context_length_exceeded"
        # The gateway holds the prompt to the route's context itself (what /v1/models says).
        assert f"context of {SMALL_CONTEXT} tokens" in refused.json()["error"]["message"]
        port = small.address.rsplit(":", 1)[1]
        small.component.stop()  # drains and deregisters
        swarm.start_workers("0:6", n_ctx_per_session=512, port=int(port))
        assert swarm.live_workers()[0].address == small.address
        swarm.wait_routable(nodes=1)
        deadline = time.monotonic() + 10
        answered = chat(swarm, base_url, LONG_ANSWER)
        while answered.status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.2)  # the old entry may still be listed for a heartbeat or two
            answered = chat(swarm, base_url, LONG_ANSWER)
        assert answered.status_code == 200, answered.text
        assert answered.json()["usage"]["completion_tokens"] > 0
