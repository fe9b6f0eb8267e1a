"""Per-hop latency of served requests, end to end: three real llama.cpp workers on the tiny
synthetic model (a 3-way split), and on SmolLM2 with MESHNET_ENABLE_REAL_INFERENCE_TESTS=1, a
real gateway, requests through the official ``openai`` client.

Every hop times the sampled decode steps of each request (``route.hop_timing``) and the gateway
shows them: ``/metrics`` has a ``meshnet_gateway_hop_seconds`` histogram for each of the three
node ids (read with Prometheus' own parser), each with the same count, as every sampled step
times every hop; ``/v1/status/history`` has a ``hop_seconds`` series for each.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from swarm_harness import Swarm, write_tiny_model

from meshnet.artifact.provision import model_path
from meshnet.route.hop_timing import HOP_TIMING_EVERY

pytestmark = pytest.mark.timeout(180)

MAX_TOKENS = 24


SMOLLM2 = model_path(Path(os.environ.get("MESHNET_DATA_DIR", Path(__file__).resolve().parents[2] / ".data")) / "models")
REAL = os.environ.get("MESHNET_ENABLE_REAL_INFERENCE_TESTS") == "1" and SMOLLM2.exists()
SPLITS = {"tiny": ("0:2", "2:4", "4:6"), "smollm2": ("0:10", "10:20", "20:30")}


@pytest.fixture(scope="module", params=["tiny", "smollm2"])
def swarm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    if request.param == "smollm2" and not REAL:
        pytest.skip("set MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 with SmolLM2 provisioned")
    model = write_tiny_model(tmp_path_factory.mktemp("model")) if request.param == "tiny" else SMOLLM2
    with Swarm(tmp_path_factory.mktemp("swarm"), model, model_name=request.param) as running:
        running.start_tracker()
        running.start_workers(*SPLITS[request.param])
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
                model=swarm.model_name, messages=messages, max_tokens=MAX_TOKENS, stream=True, temperature=0
            )
            generated += sum(1 for chunk in stream if chunk.choices and chunk.choices[0].delta.content)
        else:
            reply = client.chat.completions.create(
                model=swarm.model_name, messages=messages, max_tokens=MAX_TOKENS, temperature=0
            )
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
