"""Worker processes serving a quantized KV (``--kv-type``): a q8_0 route of two real workers
decodes exactly what the whole model does with a q8_0 KV, and a route that would chain a q8_0
shard to an f16 one is refused (the KV type is part of the recipe)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_harness import WorkerCluster, WorkerSpec, generate, greedy_request, new_driver

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "engine"))

from engine_routes import greedy, prompt

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.core.errors import FailedPrecondition
from meshnet.core.kv_type import KvType
from meshnet.core.layers import LayerRange
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_llama_shard
from meshnet.route.shard_stream import ChannelPool

pytestmark = pytest.mark.timeout(180)

CONTEXT, CHUNK, TOKENS = 128, 32, 16
SPEC = SyntheticSpec(n_layers=4, head_dim=32)
"""Heads 32 wide: llama.cpp stores a quantized KV in whole 32-value blocks per head."""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[WorkerCluster]:
    with WorkerCluster(tmp_path / "workers") as running:
        yield running


def _whole(source: Path, cache: Path, tokens: list[int]) -> list[int]:
    config = LlamaConfig(n_threads=1, max_slots=1, n_ctx_per_slot=CONTEXT, max_batch_tokens=CHUNK, kv_type=KvType.Q8_0)
    whole = LocalRoute([open_llama_shard(describe_model(source), LayerRange(0, 4), SliceCache(cache), config)])
    try:
        return greedy(whole, tokens, TOKENS).tokens  # type: ignore[arg-type]
    finally:
        whole.close()


async def _run(route: list, tokens: list[int]) -> list[int]:  # type: ignore[type-arg]
    pool = ChannelPool(16 * 1024 * 1024)
    try:
        return await generate(pool, new_driver(pool), route, greedy_request(tokens, TOKENS))
    finally:
        await pool.close()


def test_a_q8_0_route_equals_the_whole_model_and_never_chains_an_f16_shard(
    cluster: WorkerCluster, tmp_path: Path
) -> None:
    source = write_synthetic_model(tmp_path / "llama-4L-hd32.gguf", SPEC)
    tokens = [int(t) for t in prompt(40, 5)]
    expected = _whole(source, tmp_path / "ref-cache", tokens)
    options = {"fake_layers": None, "model": source, "max_sessions": 2, "context": CONTEXT, "threads": 1}

    def spec(layers: LayerRange, kv_type: KvType) -> WorkerSpec:
        return WorkerSpec(layers, settings={"prefill_chunk": CHUNK, "kv_type": kv_type}, **options)  # type: ignore[arg-type]

    head, tail, f16_tail = cluster.start(
        spec(LayerRange(0, 2), KvType.Q8_0),
        spec(LayerRange(2, 4), KvType.Q8_0),
        spec(LayerRange(2, 4), KvType.F16),
        timeout_s=120,
    )
    assert head.fingerprint == tail.fingerprint != f16_tail.fingerprint
    assert asyncio.run(_run([head, tail], tokens)) == expected
    with pytest.raises(FailedPrecondition, match=f"recipe {head.fingerprint} reached a shard serving"):
        asyncio.run(_run([head, f16_tail], tokens))
