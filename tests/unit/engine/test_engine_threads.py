"""A one-token step's logits do not depend on the thread count or on batching, at any length.

ggml's CPU flash attention splits a lone query row's KV into one part per thread once the KV
view holds 512 cells, and sums the parts: on several threads that rounds otherwise than the
per-row path a batched step takes, and otherwise than a node with another thread count. The
backend runs such steps on one thread (``LlamaBackend._threads_for``); these tests compare a
2-thread shard with a 1-thread one and with itself batched, past that length (the synthetic
llama model, real llama.cpp).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import StepInput
from meshnet.engine.llama_backend import LlamaBackend
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.shards import open_llama_shard

POSITIONS = 300
"""Past 256 positions the KV view is 512 cells: the split-KV path."""


def _backend(source: Path, cache: Path, threads: int) -> LlamaBackend:
    config = LlamaConfig(n_threads=threads, max_slots=2, n_ctx_per_slot=1024, max_batch_tokens=64)
    description = describe_model(source)
    return open_llama_shard(description, LayerRange(0, description.n_layers), SliceCache(cache), config)


def _prompts(backend: LlamaBackend) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, backend.shape.n_vocab, POSITIONS).astype(np.int32) for _ in range(2)]
    for slot, prompt in enumerate(prompts):
        backend.truncate(slot, 0)
        backend.run([StepInput(slot, 0, tokens=prompt)])
    return prompts


def _step(slot: int) -> StepInput:
    return StepInput(slot, POSITIONS, tokens=np.array([5], np.int32))


@pytest.fixture
def source(synthetic_model_factory: Callable[[SyntheticSpec], Path]) -> Path:
    return synthetic_model_factory(SyntheticSpec())


def test_a_long_step_alone_equals_it_batched_and_on_one_thread(source: Path, tmp_path: Path) -> None:
    two = _backend(source, tmp_path, threads=2)
    one = _backend(source, tmp_path, threads=1)
    try:
        _prompts(two)
        _prompts(one)
        alone = two.run([_step(0)])[0].logits
        two.truncate(0, POSITIONS)
        batched = two.run([_step(0), _step(1)])[0].logits
        single = one.run([_step(0)])[0].logits
    finally:
        two.close()
        one.close()
    assert alone is not None and np.array_equal(alone, batched), "a step batched with another differs from it alone"
    assert np.array_equal(alone, single), "a 2-thread node's step differs from a 1-thread node's"
