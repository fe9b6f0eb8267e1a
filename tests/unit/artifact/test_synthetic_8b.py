"""The 8B-class synthetic writer: Llama-3-8B's shape as random Q4_0 blocks, streamed to disk.

The full-size file (~4.65 GB) is written only by ``scripts/bench_8b_lab.py``; here its layout is
checked from the spec without drawing, and a narrow version of the same spec (same code path:
random blocks, padded vocabulary, untied Q6_K head) is written, read back, loaded by llama.cpp
and split against the whole model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.artifact.synthetic_models import llama3_8b_shaped_spec
from meshnet.artifact.synthetic_quants import payload_layout
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.shards import open_local_route

Q4_0, Q6_K = GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q6_K


def _narrow() -> SyntheticSpec:
    """The 8B spec at a width a unit test can run (rows still fit Q6_K's 256-wide blocks)."""
    return dataclasses.replace(
        llama3_8b_shaped_spec(), n_layers=3, n_embd=256, n_head=4, n_head_kv=1, n_ff=448, n_vocab=1000
    )


def test_full_spec_is_llama3_8b_shaped_and_4_3_gib() -> None:
    spec = llama3_8b_shaped_spec()
    assert (spec.n_layers, spec.n_embd, spec.n_head, spec.n_head_kv, spec.n_ff, spec.n_vocab) == (
        32,
        4096,
        32,
        8,
        14336,
        128256,
    )
    layer = [(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096), (14336, 4096), (14336, 4096), (4096, 14336)]
    weights = sum(np.prod(payload_layout(shape, Q4_0)[0]) for shape in layer) * 32
    embedding = np.prod(payload_layout((128256, 4096), Q4_0)[0])
    head = np.prod(payload_layout((128256, 4096), Q6_K)[0])
    total = int(weights + embedding + head)
    assert 4.3 * 2**30 < total < 4.4 * 2**30  # llama.cpp's Llama-3-8B Q4_0 file: 4.33 GiB


def test_narrow_version_has_the_8b_layout(tmp_path: Path) -> None:
    spec = _narrow()
    path = write_synthetic_model(tmp_path / "m.gguf", spec)
    reader = GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    assert tensors["token_embd.weight"].tensor_type == Q4_0
    assert tensors["output.weight"].tensor_type == Q6_K
    assert tensors["blk.0.ffn_down.weight"].tensor_type == Q4_0
    assert list(tensors["blk.2.ffn_gate.weight"].shape) == [256, 448]  # ggml order: row length first
    assert list(tensors["blk.1.attn_k.weight"].shape) == [256, 64]
    assert len(tensors) == 2 + 3 * 9 + 1
    for tensor in tensors.values():  # every tensor holds exactly its type's bytes
        block, size = {Q4_0: (32, 18), Q6_K: (256, 210), GGMLQuantizationType.F32: (1, 4)}[tensor.tensor_type]
        assert tensor.n_bytes == int(np.prod(tensor.shape)) // block * size
    description = describe_model(path)
    assert (description.n_layers, description.n_embd, description.n_head_kv) == (3, 256, 1)
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == 1000


def test_random_blocks_are_deterministic_and_scaled(tmp_path: Path) -> None:
    first = write_synthetic_model(tmp_path / "a.gguf", _narrow()).read_bytes()
    assert first == write_synthetic_model(tmp_path / "b.gguf", _narrow()).read_bytes()
    other = write_synthetic_model(tmp_path / "c.gguf", dataclasses.replace(_narrow(), seed=9)).read_bytes()
    assert hashlib.sha256(first).digest() != hashlib.sha256(other).digest()
    tensor = next(t for t in GGUFReader(tmp_path / "a.gguf").tensors if t.name == "blk.0.attn_q.weight")
    scales = np.asarray(tensor.data).reshape(-1, 18)[:, :2].copy().view(np.float16).ravel()
    assert np.all(np.abs(scales) == np.float16(0.08 / 4.6))  # random nibbles under a patched block scale
    assert 0.4 < np.mean(scales < 0) < 0.6  # signed, so the matrix is centred on zero


def test_writer_streams_one_tensor_at_a_time(tmp_path: Path) -> None:
    spec = dataclasses.replace(_narrow(), n_layers=8, n_embd=1024, n_head=8, n_head_kv=2, n_ff=2048, n_vocab=4000)
    tracemalloc.start()
    try:
        path = write_synthetic_model(tmp_path / "big.gguf", spec)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # ~30 MB of tensors; held all at once (as GGUFWriter.add_tensor does) the peak would exceed it.
    assert peak < path.stat().st_size / 4


@pytest.mark.timeout(120)
def test_narrow_version_splits_exactly_on_llama_cpp(tmp_path: Path) -> None:
    source = describe_model(write_synthetic_model(tmp_path / "m.gguf", _narrow()))
    config = LlamaConfig(max_slots=1, n_ctx_per_slot=128, max_batch_tokens=32, n_threads=1)
    cache = SliceCache(tmp_path / "cache")
    whole, split = open_local_route(source, 1, cache, config), open_local_route(source, 3, cache, config)
    try:
        tokens = np.arange(5, 45, dtype=np.int32)
        expected = whole.forward(0, 0, tokens, "all")
        assert np.isfinite(expected).all() and expected.shape == (40, 1000)
        np.testing.assert_array_equal(split.forward(0, 0, tokens, "all"), expected)
        # Random blocks centred on zero: greedy decoding follows the prompt instead of repeating
        # one token (uncentred blocks drive every hidden state the same way).
        greedy = [int(np.argmax(row)) for row in expected]
        assert len(set(greedy)) > 10, greedy
    finally:
        whole.close()
        split.close()
