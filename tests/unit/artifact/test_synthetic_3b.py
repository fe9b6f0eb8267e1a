"""The synthetic-3b model: Llama-3.2-3B's shape as random Q4_0 blocks and a Q6_K tied table.

The full-size file (~1.9 GB) is written only by ``meshnet provision synthetic-3b`` or the bench's
``--synthetic-3b`` preset; here its layout is checked from the spec without drawing a weight, and
a narrow version of the same spec (same code path: random blocks, tied Q6_K table, llama3 rope
scaling, padded vocabulary) is written, read back, loaded by llama.cpp and split against the
written file loaded whole.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.provision import model_package
from meshnet.artifact.synthetic import SyntheticSpec, synthetic_layout, write_synthetic_model
from meshnet.artifact.synthetic_models import SyntheticModel, llama32_3b_shaped_spec, provision_synthetic
from meshnet.core.errors import InvalidArgument
from meshnet.core.generation import GenerationRequest
from meshnet.core.layers import LayerRange
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.shards import open_local_route

Q4_0, Q6_K, F32 = GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q6_K, GGMLQuantizationType.F32


def _narrow(seed: int = 3) -> SyntheticSpec:
    """The 3B spec at a width a unit test can run, its weight spread scaled as the full one's
    (2/sqrt(n_embd)); rows still fit Q6_K's 256-wide blocks."""
    return dataclasses.replace(
        llama32_3b_shaped_spec(),
        n_layers=4,
        n_embd=256,
        n_head=4,
        n_head_kv=2,
        head_dim=64,
        n_ff=512,
        n_vocab=1000,
        weight_scale=2 / math.sqrt(256),
        seed=seed,
    )


def test_full_spec_is_llama32_3b_shaped_and_1_9_gb() -> None:
    spec = llama32_3b_shaped_spec()
    shape = (spec.n_layers, spec.n_embd, spec.n_head, spec.n_head_kv, spec.n_embd_head, spec.n_ff, spec.n_vocab)
    assert shape == (28, 3072, 24, 8, 128, 8192, 128256)  # Meta's config.json for Llama-3.2-3B
    assert spec.tied_embeddings and spec.rope_freq_base == 500000.0
    layout = {t.name: t for t in synthetic_layout(spec)}
    assert "output.weight" not in layout  # tied: the LM head is the token table
    assert layout["token_embd.weight"].ggml_type == Q6_K
    assert layout["token_embd.weight"].n_bytes == 128256 * 3072 // 256 * 210
    assert layout["rope_freqs.weight"].stored_shape == (64,)
    per_layer = [(3072, 3072), (1024, 3072), (1024, 3072), (3072, 3072), (8192, 3072), (8192, 3072), (3072, 8192)]
    for name, (rows, row_length) in zip(
        ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"), per_layer, strict=True
    ):
        tensor = layout[f"blk.27.{name}.weight"]
        assert (tensor.ggml_type, tensor.n_bytes) == (Q4_0, rows * row_length // 32 * 18)
    assert len(layout) == 1 + 1 + 28 * 9 + 1
    total = sum(t.n_bytes for t in layout.values())
    assert 1.90e9 < total < 1.92e9  # llama.cpp's Llama-3.2-3B Q4_0 file: 1.92 GB with its BPE vocabulary


def test_rope_frequency_factors_follow_llama3_scaling() -> None:
    spec = llama32_3b_shaped_spec()
    assert spec.rope_scaling is not None
    factors = spec.rope_scaling.frequency_factors(128, 500000.0)
    # Wavelength 2*pi*500000**(i/64) is below 8192/4 = 2048 up to pair i = 28 and above 8192
    # from pair 35 on: unscaled, then smoothly rising, then divided by the full factor 32.
    assert factors.shape == (64,) and factors.dtype == np.float32
    assert np.all(factors[:29] == 1.0) and np.all(factors[35:] == 32.0)
    assert np.all(np.diff(factors) >= 0) and np.all((factors[29:35] > 1.0) & (factors[29:35] < 32.0))


def test_narrow_version_has_the_3b_layout(tmp_path: Path) -> None:
    path = write_synthetic_model(tmp_path / "m.gguf", _narrow())
    reader = GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) == {t.name for t in synthetic_layout(_narrow())}
    assert (tensors["token_embd.weight"].tensor_type, tensors["blk.0.ffn_up.weight"].tensor_type) == (Q6_K, Q4_0)
    assert tensors["rope_freqs.weight"].tensor_type == F32

    def value(key: str) -> float:
        field = reader.fields[key]
        return float(field.parts[field.data[0]][0])

    assert value("llama.rope.freq_base") == 500000.0
    assert value("llama.attention.key_length") == 64
    assert value("llama.context_length") == 131072
    description = describe_model(path)
    assert (description.n_layers, description.n_embd, description.n_head_kv) == (4, 256, 2)


NARROW_SHA256 = "f9a72c865228a4125d8c2b0d9d8e98aff3091c4987e5caa23e17a758a0f48a17"
"""The narrow spec's file as the writer wrote it when pinned: a provisioned name promises the
same bytes, so a writer change that moves them must move this (and the fingerprinted names)."""


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    first = write_synthetic_model(tmp_path / "a.gguf", _narrow()).read_bytes()
    assert hashlib.sha256(first).hexdigest() == NARROW_SHA256
    assert first == write_synthetic_model(tmp_path / "b.gguf", _narrow()).read_bytes()
    other = write_synthetic_model(tmp_path / "c.gguf", _narrow(seed=4)).read_bytes()
    assert hashlib.sha256(first).digest() != hashlib.sha256(other).digest()
    assert len(first) == len(other)


def _stock_llama(path: Path) -> Any:
    """Stock llama.cpp on the written file itself, at the engine's settings for this test (the
    oracle: not the slicer's own one-shard slice, which shares the code under test)."""
    import llama_cpp  # the reference implementation; only tests import it outside the engine

    return llama_cpp.Llama(
        model_path=str(path),
        n_ctx=128,
        n_batch=32,
        n_ubatch=32,
        flash_attn=True,
        n_threads=1,
        n_threads_batch=1,
        n_gpu_layers=0,
        logits_all=True,
        verbose=False,
    )


def _stock_greedy(stock: Any, prompt: tuple[int, ...], n_tokens: int) -> list[int]:
    stock.reset()
    stock.eval(list(prompt))
    tokens: list[int] = []
    while len(tokens) < n_tokens:
        tokens.append(int(np.argmax(stock.scores[stock.n_tokens - 1])))
        stock.eval(tokens[-1:])
    return tokens


@pytest.mark.timeout(120)
def test_narrow_version_splits_exactly_and_generates_on_llama_cpp(tmp_path: Path) -> None:
    path = write_synthetic_model(tmp_path / "m.gguf", _narrow())
    config = LlamaConfig(max_slots=1, n_ctx_per_slot=128, max_batch_tokens=32, n_threads=1)
    stock, split = _stock_llama(path), open_local_route(describe_model(path), 2, SliceCache(tmp_path / "cache"), config)
    try:
        tokens = np.arange(5, 45, dtype=np.int32)
        stock.eval(tokens.tolist())
        expected = np.asarray(stock.scores[:40], np.float32)  # logits: [n_tokens, n_vocab]
        assert np.isfinite(expected).all() and expected.shape == (40, 1000)
        np.testing.assert_array_equal(split.forward(0, 0, tokens, "all"), expected)
        split.release(0)
        # A tied table small against what the blocks add: the head does not read back the input
        # token, and greedy decoding keeps moving instead of repeating one token forever.
        assert sum(int(np.argmax(row)) == token for row, token in zip(expected, tokens, strict=True)) < 4
        for prompt in ((5, 6, 7, 8), (100, 200, 300)):
            generated = list(split.generate(GenerationRequest(prompt, 24)))
            assert generated == _stock_greedy(stock, prompt, 24)
            assert len(set(generated[8:])) > 4, generated
    finally:
        stock.close()
        split.close()


def test_every_slice_carries_the_rope_frequency_factors(tmp_path: Path) -> None:
    """llama3 rope scaling lives in one global tensor: a slice without it would rotate with
    unscaled frequencies (llama.cpp treats the tensor as optional) and drift silently."""
    path = write_synthetic_model(tmp_path / "m.gguf", _narrow())
    written = {t.name: t for t in GGUFReader(path).tensors}["rope_freqs.weight"]
    cache = SliceCache(tmp_path / "cache")
    for layers in (LayerRange(0, 1), LayerRange(1, 3), LayerRange(3, 4)):
        sliced = GGUFReader(cache.shard_files(path, layers, 4).slice)
        factors = {t.name: t for t in sliced.tensors}.get("rope_freqs.weight")
        assert factors is not None, f"slice {layers} has no rope_freqs.weight"
        np.testing.assert_array_equal(np.asarray(factors.data), np.asarray(written.data))


def test_provisioning_writes_once_by_name(tmp_path: Path) -> None:
    model = SyntheticModel("tiny", "tiny-q4_0", _narrow)
    path = provision_synthetic(tmp_path / "models", model)
    assert path.parent == tmp_path / "models" and path.name.startswith("tiny-q4_0-")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == NARROW_SHA256
    written = path.stat().st_mtime_ns
    assert provision_synthetic(tmp_path / "models", model).stat().st_mtime_ns == written


def test_a_changed_spec_under_the_same_name_is_written_anew(tmp_path: Path) -> None:
    """A name means the same bytes: a file written from an older spec is never handed out."""
    old = provision_synthetic(tmp_path, SyntheticModel("tiny", "tiny-q4_0", _narrow))
    for changed in (
        lambda: _narrow(seed=4),
        lambda: dataclasses.replace(_narrow(), rope_scaling=None),
        lambda: dataclasses.replace(_narrow(), embedding_type=Q4_0),
    ):
        path = provision_synthetic(tmp_path, SyntheticModel("tiny", "tiny-q4_0", changed))
        assert path != old
        assert path.read_bytes() == write_synthetic_model(tmp_path / "fresh.gguf", changed()).read_bytes()
    with pytest.raises(InvalidArgument, match="synthetic-3b"):
        model_package("synthetic-7b")
