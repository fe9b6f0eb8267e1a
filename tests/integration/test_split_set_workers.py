"""A gguf-split set served 3 ways by real worker processes (``--model`` the set's first part or
its directory): 32 greedy tokens identical to the unsplit file's whole model in process."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from swarm_harness import TINY_SPEC
from worker_harness import RunningWorker, WorkerCluster, WorkerSpec, generate, greedy_request, new_driver

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "engine"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "artifact"))

from artifact_split import write_split_set
from engine_routes import greedy
from family_models import prompt_for

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.core.layers import LayerRange
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_llama_shard
from meshnet.route.shard_stream import ChannelPool

pytestmark = pytest.mark.timeout(180)

CONTEXT = 128
CHUNK = 32
TOKENS = 32
CONFIG = LlamaConfig(n_threads=1, max_slots=1, n_ctx_per_slot=CONTEXT, max_batch_tokens=CHUNK)
RANGES = (LayerRange(0, 2), LayerRange(2, 5), LayerRange(5, 6))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[WorkerCluster]:
    with WorkerCluster(tmp_path / "workers") as running:
        yield running


def _whole_model(source: Path, cache: Path) -> tuple[tuple[int, ...], list[int]]:
    """A prompt and the unsplit file's whole-model greedy tokens for it."""
    description = describe_model(source)
    whole = LocalRoute([open_llama_shard(description, LayerRange(0, description.n_layers), SliceCache(cache), CONFIG)])
    try:
        prompt = tuple(int(t) for t in prompt_for("llama", whole.backends[-1].shape.n_vocab, 12, seed=1))
        return prompt, greedy(whole, np.asarray(prompt), TOKENS).tokens
    finally:
        whole.close()


async def _run(route: Sequence[RunningWorker], prompt: tuple[int, ...]) -> list[int]:
    pool = ChannelPool(16 * 1024 * 1024)
    try:
        return await generate(pool, new_driver(pool), route, greedy_request(prompt, TOKENS))
    finally:
        await pool.close()


def test_a_split_set_served_three_ways_equals_the_unsplit_whole_model(
    cluster: WorkerCluster, synthetic_model_factory: Any, tmp_path: Path
) -> None:
    unsplit = synthetic_model_factory(TINY_SPEC)
    parts = write_split_set(unsplit, tmp_path / "set", max_tensors=16)
    assert len(parts) >= 3
    prompt, expected = _whole_model(unsplit, tmp_path / "ref-cache")
    options: dict[str, Any] = {"fake_layers": None, "context": CONTEXT, "threads": 1, "drain_grace": 0}
    settings = {"prefill_chunk": CHUNK}
    models = (parts[0], parts[0].parent, parts[0])  # the first part, or the directory holding the set
    pairs = zip(RANGES, models, strict=True)
    specs = [WorkerSpec(layers, model=model, settings=settings, **options) for layers, model in pairs]
    route = cluster.start(*specs, timeout_s=120)
    assert asyncio.run(_run(route, prompt)) == expected
