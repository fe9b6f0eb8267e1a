"""Per-hop latency of served requests, end to end: three real llama.cpp workers on the tiny
synthetic model (a 3-way split), a real gateway, requests through the official ``openai`` client.

Every hop times the sampled decode steps of each request (``route.hop_timing``) and the gateway
shows them: ``/metrics`` has a ``meshnet_gateway_hop_seconds`` histogram for each of the three
node ids (read with Prometheus' own parser), each with the same count, as every sampled step
times every hop; ``/v1/status/history`` has a ``hop_seconds`` series for each.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from swarm_harness import MODEL_NAME, Swarm, write_tiny_model

from meshnet.route.hop_timing import HOP_TIMING_EVERY

pytestmark = pytest.mark.timeout(180)

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    model = write_tiny_model(tmp_path_factory.mktemp("model"))
    with Swarm(tmp_path_factory.mktemp("swarm"), model) as running:
        running.start_tracker()
        running.start_workers("0:2", "2:4", "4:6")
        running.start_gateway()
        running.wait_routable(3)
        yield running


def test_each_hop_of_a_3_way_route_is_timed_on_served_requests(swarm: Swarm) -> None:
    base_url = swarm.gateways[0].ready_line.split()[3]
    client = openai.OpenAI(base_url=base_url + "/v1", api_key=swarm.api_key, max_retries=0)
    generated = 0
    for i in range(3):
        messages: Any = [{"role": "user", "content": f"count to {i + 3}"}]
        if i % 2:
            stream = client.chat.completions.create(
                model=MODEL_NAME, messages=messages, max_tokens=MAX_TOKENS, stream=True
            )
            generated += sum(1 for chunk in stream if chunk.choices and chunk.choices[0].delta.content)
        else:
            reply = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=MAX_TOKENS)
            assert reply.usage is not None
            generated += reply.usage.completion_tokens
    assert generated > 3, "the requests decoded at least one step each"
    nodes = sorted(worker.node_id for worker in swarm.workers)
    assert len(set(nodes)) == 3

    families = {f.name: f for f in text_string_to_metric_families(httpx.get(base_url + "/metrics").text)}
    hops = families["meshnet_gateway_hop_seconds"]
    assert hops.type == "histogram"
    counts = {s.labels["node"]: s.value for s in hops.samples if s.name.endswith("_count")}
    sums = {s.labels["node"]: s.value for s in hops.samples if s.name.endswith("_sum")}
    assert sorted(counts) == nodes, counts
    # Each sampled decode step times all three hops; at most one step in HOP_TIMING_EVERY is sampled.
    assert len(set(counts.values())) == 1 and counts[nodes[0]] >= 3, counts
    assert counts[nodes[0]] <= 3 * (1 + (MAX_TOKENS - 1) // HOP_TIMING_EVERY), counts
    assert all(0 < sums[node] < 60 for node in nodes), sums

    history = httpx.get(base_url + "/v1/status/history", headers=swarm.auth).json()
    series = history["series"]["hop_seconds"]
    assert sorted(series) == nodes
    for node in nodes:
        assert sum(point["count"] for point in series[node]) == counts[node]
        assert all(point["mean"] > 0 for point in series[node])
