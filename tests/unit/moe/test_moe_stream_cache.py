"""A bounded expert cache streams routed experts from the file and leaves every logit unchanged.

Whole-model llama.cpp against an observer node (``0/1``) and a node of an in-process group of 2,
each with a cache holding a quarter of the routed bytes (Q8_0, and Q4_0 loaded without repacking:
the kernels read the file's pages, not a repacked copy): logits bitwise equal over a prefill and
greedy decode, while the cache misses, reads bytes from the file and evicts. Repacked weights are
refused with a clear error that names --no-repack.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Quant

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.core.errors import EngineError
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import StepInput
from meshnet.engine.bitwise import bit_identical
from meshnet.engine.llama_backend import LlamaBackend
from meshnet.engine.llama_config import LlamaConfig
from meshnet.moe.backend import ExpertParallelBackend
from meshnet.moe.group import ExpertGroup
from meshnet.moe.ownership import ExpertOwnership
from meshnet.moe.shape import read_moe_shape

SPEC = SyntheticSpec(
    architecture="qwen3moe", n_layers=3, n_embd=256, n_ff=256, n_expert=16, n_expert_used=4, n_ff_expert=256,
    weight_type=Quant.Q8_0, seed=7,
)  # fmt: skip
CONFIG = LlamaConfig(n_threads=1, max_slots=1, n_ctx_per_slot=256, max_batch_tokens=64)


def _whole(tmp_path: Path, spec: SyntheticSpec) -> Path:
    model = write_synthetic_model(tmp_path / "moe.gguf", spec)
    return SliceCache(tmp_path / "cache").shard_files(model, LayerRange(0, spec.n_layers), spec.n_layers).slice


def _generate(backend: LlamaBackend, prompt: np.ndarray, decode: int) -> list[np.ndarray]:
    out = backend.run([StepInput(0, 0, tokens=prompt, want_logits="all")])[0].logits
    assert out is not None
    logits, position = [out], len(prompt)
    for _ in range(decode):
        token = np.array([int(np.argmax(logits[-1][-1]))], np.int32)
        step = backend.run([StepInput(0, position, tokens=token)])[0].logits
        assert step is not None
        logits.append(step)
        position += 1
    return logits


@pytest.mark.parametrize(
    ("spec", "config"),
    [(SPEC, CONFIG), (replace(SPEC, weight_type=Quant.Q4_0), replace(CONFIG, repack=False))],
    ids=["q8_0", "q4_0-no-repack"],
)
def test_bounded_cache_is_bit_identical_and_streams(tmp_path: Path, spec: SyntheticSpec, config: LlamaConfig) -> None:
    path = _whole(tmp_path, spec)
    capacity = read_moe_shape(path).routed_bytes // 4
    prompt = np.random.default_rng(1).integers(3, 290, 48).astype(np.int32)
    whole = LlamaBackend(path, config)  # the reference loads as the nodes do (repacking changes Q4_0)
    try:
        want = _generate(whole, prompt, 24)
    finally:
        whole.close()
    if not config.repack:  # the setting is part of the recipe: repacked, this model computes other logits
        repacked = LlamaBackend(path, replace(config, repack=True))
        try:
            assert not np.array_equal(_generate(repacked, prompt, 0)[0], want[0])
        finally:
            repacked.close()
    node = ExpertParallelBackend(path, config, ExpertOwnership(0, 1), expert_cache_bytes=capacity)
    try:
        got = _generate(node, prompt, 24)
        counters = node.expert_cache
    finally:
        node.close()
    group = ExpertGroup.open(path, config, 2, expert_cache_bytes=capacity // 2)
    try:
        in_group = _generate(group, prompt, 24)  # type: ignore[arg-type]
        group_counters = [n.expert_cache for n in group.nodes]
    finally:
        group.close()
    for step, (a, b, c) in enumerate(zip(want, got, in_group, strict=True)):
        assert bit_identical(a, b), f"step {step} differs"
        assert bit_identical(a, c), f"step {step} differs in the group of 2"
    assert all(c is not None and c.misses > 0 and c.resident_bytes <= capacity // 2 for c in group_counters)
    assert counters is not None
    print(counters, f"hit rate {counters.hit_rate:.2f}")
    assert counters.misses > 0 and counters.evictions > 0 and 0 < counters.hit_rate < 1
    assert counters.resident_bytes <= capacity
    per_expert = read_moe_shape(path).routed_bytes // (spec.n_layers * spec.n_expert)
    assert counters.bytes_read == counters.misses * per_expert


@pytest.mark.parametrize(
    "spec",
    [
        SyntheticSpec(
            architecture="qwen3moe", n_layers=2, n_expert=64, n_expert_used=8, n_ff_expert=32, weight_type=Quant.Q4_0
        ),
        replace(SPEC, weight_type=Quant.Q4_0),  # the model the cache bounds above once loaded with repack=False
    ],
    ids=["64-experts", "16-experts"],
)
def test_repacked_weights_are_refused(tmp_path: Path, spec: SyntheticSpec) -> None:
    path = _whole(tmp_path, spec)
    node = ExpertParallelBackend(path, CONFIG, ExpertOwnership(0, 1), expert_cache_bytes=1 << 20)
    try:
        with pytest.raises(EngineError, match=r"repacked.*--no-repack"):
            node.run([StepInput(0, 0, tokens=np.array([5, 6, 7], np.int32))])
    finally:
        node.close()
