"""Prompt KV reused across requests on routes of real worker processes, against the whole model
run cold in process: a prompt that starts like an earlier one restores that prefix on every
shard and prefills only the rest, and its tokens are the cold run's, bit for bit.

Each family runs on a 3-way split whose workers keep prompt prefixes (``--prefix-cache-mb``);
gemma3's synthetic model has an 8-token sliding window, so the reused prefix (several chunks)
reaches past the window the continuation attends over.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from swarm_harness import MODEL_NAME, Reference, Swarm, write_tiny_model
from worker_harness import (
    RunningWorker,
    WorkerCluster,
    WorkerSpec,
    generate_reusing,
    greedy_request,
    metrics,
    new_driver,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "engine"))

from engine_routes import greedy
from family_models import spec_for

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.core.layers import LayerRange, split_evenly
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_llama_shard
from meshnet.node.config import WorkerConfig
from meshnet.route.shard_stream import ChannelPool

pytestmark = pytest.mark.timeout(240)

CONTEXT = 256
CHUNK = 16
TOKENS = 12
CONFIG = LlamaConfig(n_threads=1, max_slots=1, n_ctx_per_slot=CONTEXT, max_batch_tokens=CHUNK)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[WorkerCluster]:
    with WorkerCluster(tmp_path / "workers") as running:
        yield running


def _conversation(n_vocab: int, turns: int, seed: int) -> list[tuple[int, ...]]:
    """Each turn's prompt: the one before, its answer (here: any tokens) and a new message."""
    rng = np.random.default_rng(seed)
    prompt: list[int] = []
    prompts = []
    for _ in range(turns):
        prompt += [int(t) for t in rng.integers(3, n_vocab, 21)]
        prompts.append(tuple(prompt))
    return prompts


def _cold(source: Path, cache: Path, seeds: Sequence[int], turns: int) -> tuple[list[tuple[int, ...]], list[list[int]]]:
    """The conversations of ``seeds``, their turns alternating, and the whole model's cold
    greedy tokens for each turn's prompt."""
    description = describe_model(source)
    whole = LocalRoute([open_llama_shard(description, LayerRange(0, description.n_layers), SliceCache(cache), CONFIG)])
    try:
        talks = [_conversation(whole.backends[-1].shape.n_vocab, turns, seed) for seed in seeds]
        prompts = [prompt for turn in zip(*talks, strict=True) for prompt in turn]
        return prompts, [greedy(whole, np.array(p, np.int32), TOKENS).tokens for p in prompts]  # type: ignore[misc]
    finally:
        whole.close()


def _start(cluster: WorkerCluster, source: Path, n_layers: int, **settings: object) -> list[RunningWorker]:
    options = {"fake_layers": None, "model": source, "max_sessions": 2, "context": CONTEXT, "threads": 1}
    specs = [
        WorkerSpec(layers, settings={"prefill_chunk": CHUNK, **settings}, drain_grace=0, **options)  # type: ignore[arg-type]
        for layers in split_evenly(n_layers, 3)
    ]
    return cluster.start(*specs, timeout_s=120)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_interleaved_conversations_reuse_their_prefixes_and_equal_cold_runs(
    family: str, cluster: WorkerCluster, synthetic_model_factory: Callable[[SyntheticSpec], Path], tmp_path: Path
) -> None:
    spec = spec_for(family, "q8_0")
    source = synthetic_model_factory(spec)
    turns, expected = _cold(source, tmp_path / "ref", (1, 2), 4)  # two conversations, alternating
    route = _start(cluster, source, spec.n_layers, prefix_cache_mb=8)

    async def scenario() -> tuple[list[tuple[list[int], int]], list[dict[str, float]]]:
        pool = ChannelPool(16 << 20)
        driver = new_driver(pool)
        try:
            served = [await generate_reusing(pool, driver, route, greedy_request(prompt, TOKENS)) for prompt in turns]
            return served, await metrics(pool, route)
        finally:
            await pool.close()

    served, figures = asyncio.run(scenario())
    assert [tokens for tokens, _ in served] == expected, "a reused prefix changed what the route generates"
    cached = [c for _, c in served]
    assert cached[:2] == [0, 0], "nothing was held before each conversation's first turn"
    # Turn n reuses turn n-1's prompt, cut to whole chunks: every later turn restores something.
    assert all(c == (len(turns[i - 2]) // CHUNK) * CHUNK for i, c in enumerate(cached) if i >= 2), cached
    for worker, values in zip(route, figures, strict=True):
        assert values["prefix_hits_total"] == 6, worker.layers
        assert values["prefix_reused_tokens_total"] == sum(cached)
        assert 0 < values["prefix_bytes"] <= values["prefix_budget_bytes"]


def test_a_worker_without_a_store_makes_the_route_compute_everything(
    cluster: WorkerCluster, synthetic_model_factory: Callable[[SyntheticSpec], Path], tmp_path: Path
) -> None:
    """--prefix-cache-mb 0 on one worker: the others hold the prefix, but the route cannot skip
    rows that worker never gets, so nothing is reused, and the output is still the cold one."""
    spec = spec_for("llama", "q8_0")
    source = synthetic_model_factory(spec)
    prompts, expected = _cold(source, tmp_path / "ref", (3,), 2)
    specs = split_evenly(spec.n_layers, 3)
    options = {"fake_layers": None, "model": source, "max_sessions": 2, "context": CONTEXT, "threads": 1}
    route = cluster.start(
        *(
            WorkerSpec(
                layers,
                settings={"prefill_chunk": CHUNK, "prefix_cache_mb": 0 if index == 1 else 8},
                drain_grace=0,
                **options,  # type: ignore[arg-type]
            )
            for index, layers in enumerate(specs)
        ),
        timeout_s=120,
    )

    async def scenario() -> list[tuple[list[int], int]]:
        pool = ChannelPool(16 << 20)
        driver = new_driver(pool)
        try:
            return [await generate_reusing(pool, driver, route, greedy_request(prompt, TOKENS)) for prompt in prompts]
        finally:
            await pool.close()

    served = asyncio.run(scenario())
    assert [tokens for tokens, _ in served] == expected
    assert [cached for _, cached in served] == [0, 0]


@pytest.fixture(scope="module")
def chat_swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Swarm, str, Reference]]:
    model = write_tiny_model(tmp_path_factory.mktemp("model"))
    reference = Reference(model, tmp_path_factory.mktemp("reference-cache"))
    with Swarm(tmp_path_factory.mktemp("swarm"), model) as running:
        running.start_tracker()
        running.start_workers("0:2", "2:4", "4:6")
        base_url = running.start_gateway()
        running.wait_routable(nodes=3)
        yield running, base_url, reference
    reference.close()


def _chat(base_url: str, swarm: Swarm, messages: list[dict[str, str]], **extra: object) -> dict[str, Any]:
    body = {"model": MODEL_NAME, "messages": messages, "max_tokens": 16, "temperature": 0, **extra}
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=swarm.auth, timeout=60)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_a_conversations_next_turn_reports_the_prompt_tokens_it_reused(
    chat_swarm: tuple[Swarm, str, Reference],
) -> None:
    """Through the gateway of a secured swarm: turn 2 resends turn 1 and its answer; the route
    reused at least turn 1's whole chunks (``usage.prompt_tokens_details.cached_tokens``), and
    both answers are the whole model's. A request with its own ``cache_salt`` reuses nothing."""
    swarm, base_url, reference = chat_swarm
    messages = [{"role": "user", "content": "the house and the dog " * 5}]
    first = _chat(base_url, swarm, messages)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    answer = first["choices"][0]["message"]["content"]
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "and the cat " * 3}]
    second = _chat(base_url, swarm, messages)
    prompt = reference.tokenizer.encode_chat(messages)
    expected = reference.text(reference.generate(prompt, 16))
    assert second["choices"][0]["message"]["content"] == expected
    usage = second["usage"]
    assert usage["prompt_tokens"] == len(prompt)
    chunk = WorkerConfig.prefill_chunk
    assert usage["prompt_tokens_details"]["cached_tokens"] >= (first["usage"]["prompt_tokens"] // chunk) * chunk > 0
    salted = _chat(base_url, swarm, messages, cache_salt="tenant-b")
    assert salted["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert salted["choices"][0]["message"]["content"] == expected
