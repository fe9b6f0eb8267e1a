"""Tiny random GGUF models of every certified family, written with ``gguf.GGUFWriter``.

They carry the default test suite and the engine's start-up certification (the way mlx-lm tests
every architecture with tiny random models): small enough to write and run in milliseconds,
real enough that llama.cpp loads them through the same code paths as a downloaded model
(quantized blocks, a SentencePiece vocabulary of the kind the family ships, a chat template).
Per family, the features whose handling a split could break:
- llama: dense blocks; qwen2: Q/K/V biases; qwen3: per-head Q/K norms;
- qwen3moe: router, stacked experts, top-k with normalized weights, optional per-layer arrays;
- gemma3: pre/post norms, sliding-window layers (period or per-layer array), Gemma's vocabulary.
Weights are drawn from a seeded generator, so a given spec always writes the same bytes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, TokenType

from meshnet.artifact.hashing import partial_path
from meshnet.artifact.synthetic_quants import payload_layout, random_payload

Family = Literal["llama", "qwen2", "qwen3", "qwen3moe", "gemma3"]
FAMILIES: tuple[Family, ...] = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma3")

TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1+'s long-context rope scaling, which a GGUF stores as a ``rope_freqs.weight``
    tensor of per-frequency divisors (``convert_hf_to_gguf``'s formula, Meta's config values)."""

    factor: float = 32.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context: int = 8192

    def frequency_factors(self, head_dim: int, base: float) -> np.ndarray:
        """One divisor per rotated pair: 1 for short wavelengths, ``factor`` for long, smooth between."""
        low_wavelength = self.original_context / self.low_freq_factor
        high_wavelength = self.original_context / self.high_freq_factor
        factors = []
        for pair in range(head_dim // 2):
            wavelength = 2 * math.pi * base ** (2 * pair / head_dim)
            if wavelength < high_wavelength:
                factors.append(1.0)
            elif wavelength > low_wavelength:
                factors.append(self.factor)
            else:
                smooth = (self.original_context / wavelength - self.low_freq_factor) / (
                    self.high_freq_factor - self.low_freq_factor
                )
                factors.append(1 / ((1 - smooth) / self.factor + smooth))
        return np.asarray(factors, np.float32)


@dataclass(frozen=True)
class SyntheticSpec:
    architecture: str = "llama"
    """One of ``FAMILIES``; any other name writes llama-shaped blocks under that name (to test
    that an architecture outside the registry is refused)."""
    n_layers: int = 4
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx_train: int = 2048
    weight_type: GGMLQuantizationType = GGMLQuantizationType.Q4_1
    embedding_type: GGMLQuantizationType = GGMLQuantizationType.Q8_0
    tied_embeddings: bool = True
    seed: int = 0
    chat_template: str | None = TINY_CHAT_TEMPLATE
    """None writes a base model: no ``tokenizer.chat_template`` (chat is refused, completions served)."""
    head_dim: int | None = None
    """Per-head width; None means ``n_embd // n_head`` (Gemma 3 and Qwen3 decouple the two)."""
    per_layer_arrays: bool = False
    """Store head counts, feed-forward and expert counts as per-layer arrays, as some converters do."""
    n_expert: int = 4
    n_expert_used: int = 2
    n_ff_expert: int = 64
    sliding_window: int = 8
    window_pattern: int | tuple[bool, ...] | None = None
    """gemma3: a period, a per-layer array, or None for llama.cpp's default period (6)."""
    n_vocab: int | None = None
    """Pad the SentencePiece vocabulary with plain pieces to this many tokens (None: ~300)."""
    output_type: GGMLQuantizationType | None = None
    """The untied LM head's type; None uses ``weight_type``."""
    random_blocks: bool = False
    """Write Q4_0/Q8_0 tensors as random blocks too (no quantization pass): fast at full size."""
    weight_scale: float = 0.08
    """Spread of the block matrices' weights. Full-width models want about 2/sqrt(n_embd): a
    projection of a normalized state then spreads by about two. Much more saturates attention;
    1/sqrt(n_embd) mixes so softly that greedy decoding settles on one token."""
    embedding_scale: float = 0.5
    """Spread of the token table. A tied table that is large against what the blocks add makes
    the LM head find the input token in the residual stream: greedy decoding then repeats it."""
    rope_freq_base: float = 10000.0
    rope_scaling: Llama3RopeScaling | None = None
    """Llama 3 rope scaling, written as the ``rope_freqs.weight`` tensor every layer reads."""

    @property
    def n_embd_head(self) -> int:
        return self.head_dim or self.n_embd // self.n_head


def _spm_vocabulary(specials: list[tuple[str, TokenType]]) -> tuple[list[str], list[float], list[int]]:
    tokens = [name for name, _ in specials]
    types = [kind for _, kind in specials]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [TokenType.BYTE] * 256
    pieces = ["▁", "▁the", "▁a", "▁is", "▁of", "▁and", "▁to", "▁in", "e", "t", "a", "o", "n", "s", "h", "r"]
    pieces += [chr(c) for c in range(ord("b"), ord("z") + 1) if chr(c) not in pieces]
    tokens += pieces
    types += [TokenType.NORMAL] * len(pieces)
    scores = [0.0] * (len(specials) + 256) + [-float(i) for i in range(len(pieces))]
    return tokens, scores, [int(t) for t in types]


def _pad_vocabulary(vocabulary: tuple[list[str], list[float], list[int]], size: int | None) -> None:
    """Grow the vocabulary to ``size`` with distinct plain pieces ("▁w0", "▁w1", ...)."""
    tokens, scores, types = vocabulary
    extra = max(0, (size or 0) - len(tokens))
    tokens += [f"▁w{i}" for i in range(extra)]
    scores += [-float(len(scores) + i) for i in range(extra)]
    types += [int(TokenType.NORMAL)] * extra


def _write_vocabulary(writer: GGUFWriter, spec: SyntheticSpec) -> int:
    """A SentencePiece ("llama") vocabulary; Gemma's special-token layout for gemma3. Returns its size."""
    control, unknown = TokenType.CONTROL, TokenType.UNKNOWN
    if spec.architecture == "gemma3":
        specials = [("<pad>", control), ("<eos>", control), ("<bos>", control), ("<unk>", unknown)]
        specials += [("<start_of_turn>", control), ("<end_of_turn>", control)]
        bos, eos = 2, 1
    else:
        specials, bos, eos = [("<unk>", unknown), ("<s>", control), ("</s>", control)], 1, 2
    vocabulary = _spm_vocabulary(specials)
    _pad_vocabulary(vocabulary, spec.n_vocab)
    tokens, scores, types = vocabulary
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_add_bos_token(True)
    if spec.architecture == "gemma3":
        writer.add_pad_token_id(0)
        writer.add_unk_token_id(3)
        writer.add_add_space_prefix(False)
    if spec.chat_template is not None:
        writer.add_chat_template(spec.chat_template)
    return len(tokens)


def _write_hyperparameters(writer: GGUFWriter, spec: SyntheticSpec) -> None:
    def per_layer(key: str, value: int) -> None:
        writer.add_array(key.format(arch=spec.architecture), [value] * spec.n_layers)

    writer.add_name(f"meshnet-synthetic-{spec.architecture}-{spec.n_layers}L")
    writer.add_context_length(spec.n_ctx_train)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layers)
    if spec.per_layer_arrays:
        per_layer("{arch}.feed_forward_length", spec.n_ff)
        per_layer("{arch}.attention.head_count", spec.n_head)
        per_layer("{arch}.attention.head_count_kv", spec.n_head_kv)
    else:
        writer.add_feed_forward_length(spec.n_ff)
        writer.add_head_count(spec.n_head)
        writer.add_head_count_kv(spec.n_head_kv)
    writer.add_rope_dimension_count(spec.n_embd_head)
    writer.add_rope_freq_base(spec.rope_freq_base)
    writer.add_layer_norm_rms_eps(1e-5)
    if spec.head_dim is not None:
        writer.add_key_length(spec.head_dim)
        writer.add_value_length(spec.head_dim)
    if spec.architecture == "qwen3moe":
        writer.add_expert_count(spec.n_expert)
        if spec.per_layer_arrays:
            per_layer("{arch}.expert_used_count", spec.n_expert_used)
            per_layer("{arch}.expert_feed_forward_length", spec.n_ff_expert)
        else:
            writer.add_expert_used_count(spec.n_expert_used)
            writer.add_expert_feed_forward_length(spec.n_ff_expert)
        writer.add_expert_weights_norm(True)  # the qwen3moe graph normalizes the top-k itself
    if spec.architecture == "gemma3":
        writer.add_sliding_window(spec.sliding_window)
        if spec.window_pattern is not None:
            pattern = spec.window_pattern
            writer.add_sliding_window_pattern(pattern if isinstance(pattern, int) else list(pattern))


Add = Callable[..., None]


def _attention(add: Add, add_norm: Add, spec: SyntheticSpec, prefix: str) -> None:
    q_width, kv_width = spec.n_head * spec.n_embd_head, spec.n_head_kv * spec.n_embd_head
    add(prefix + "attn_q.weight", (q_width, spec.n_embd))
    add(prefix + "attn_k.weight", (kv_width, spec.n_embd))
    add(prefix + "attn_v.weight", (kv_width, spec.n_embd))
    add(prefix + "attn_output.weight", (spec.n_embd, q_width))
    if spec.architecture == "qwen2":
        add(prefix + "attn_q.bias", (q_width,), GGMLQuantizationType.F32)
        add(prefix + "attn_k.bias", (kv_width,), GGMLQuantizationType.F32)
        add(prefix + "attn_v.bias", (kv_width,), GGMLQuantizationType.F32)
    if spec.architecture in ("qwen3", "qwen3moe", "gemma3"):
        add_norm(prefix + "attn_q_norm.weight", spec.n_embd_head)
        add_norm(prefix + "attn_k_norm.weight", spec.n_embd_head)


def _feed_forward(add: Add, spec: SyntheticSpec, prefix: str) -> None:
    if spec.architecture == "qwen3moe":
        # The router stays F32 (llama-quantize keeps ffn_gate_inp unquantized); experts are stacked.
        add(prefix + "ffn_gate_inp.weight", (spec.n_expert, spec.n_embd), GGMLQuantizationType.F32, scale=0.5)
        add(prefix + "ffn_gate_exps.weight", (spec.n_expert, spec.n_ff_expert, spec.n_embd))
        add(prefix + "ffn_up_exps.weight", (spec.n_expert, spec.n_ff_expert, spec.n_embd))
        add(prefix + "ffn_down_exps.weight", (spec.n_expert, spec.n_embd, spec.n_ff_expert))
        return
    add(prefix + "ffn_gate.weight", (spec.n_ff, spec.n_embd))
    add(prefix + "ffn_up.weight", (spec.n_ff, spec.n_embd))
    add(prefix + "ffn_down.weight", (spec.n_embd, spec.n_ff))


@dataclass(frozen=True)
class _Tensor:
    """A tensor announced before its bytes exist: drawn only when its turn to be written comes."""

    name: str
    shape: tuple[int, ...]
    """numpy order of the payload (quantized: rows of block bytes)."""
    dtype: np.dtype
    raw_type: GGMLQuantizationType | None
    draw: Callable[[], np.ndarray]


def _plan_tensors(spec: SyntheticSpec, n_vocab: int) -> list[_Tensor]:
    """Every tensor in file order. Draws happen in this order at write time, from one seeded
    generator, so a spec always writes the same bytes and only one tensor is in memory at once."""
    rng = np.random.default_rng(spec.seed)
    planned: list[_Tensor] = []

    def add(name: str, shape: tuple[int, ...], qtype: GGMLQuantizationType | None = None, scale: float = 0.0) -> None:
        # shape is numpy order: (rows, row_length); scale 0 means the spec's weight_scale
        spread = scale or spec.weight_scale
        wanted = spec.weight_type if qtype is None else qtype
        stored, dtype, used = payload_layout(shape, wanted)
        raw = None if used == GGMLQuantizationType.F32 else used
        planned.append(
            _Tensor(name, stored, dtype, raw, lambda: random_payload(rng, shape, wanted, spread, spec.random_blocks)[0])
        )

    def add_norm(name: str, width: int | None = None) -> None:
        size = width or spec.n_embd
        planned.append(
            _Tensor(
                name,
                (size,),
                np.dtype(np.float32),
                None,
                lambda: (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32),
            )
        )

    add("token_embd.weight", (n_vocab, spec.n_embd), spec.embedding_type, scale=spec.embedding_scale)
    if spec.rope_scaling is not None:
        factors = spec.rope_scaling.frequency_factors(spec.n_embd_head, spec.rope_freq_base)
        planned.append(_Tensor("rope_freqs.weight", factors.shape, factors.dtype, None, lambda: factors))
    for layer in range(spec.n_layers):
        prefix = f"blk.{layer}."
        add_norm(prefix + "attn_norm.weight")
        _attention(add, add_norm, spec, prefix)
        if spec.architecture == "gemma3":
            add_norm(prefix + "post_attention_norm.weight")
        add_norm(prefix + "ffn_norm.weight")
        _feed_forward(add, spec, prefix)
        if spec.architecture == "gemma3":
            add_norm(prefix + "post_ffw_norm.weight")
    add_norm("output_norm.weight")
    if not spec.tied_embeddings:
        add("output.weight", (n_vocab, spec.n_embd), spec.output_type)
    return planned


@dataclass(frozen=True)
class TensorLayout:
    """A tensor as a spec writes it, known before (and without) drawing its bytes."""

    name: str
    ggml_type: GGMLQuantizationType
    stored_shape: tuple[int, ...]
    """numpy order of the payload (quantized: rows of block bytes)."""
    n_bytes: int


def _prepare(spec: SyntheticSpec) -> tuple[GGUFWriter, list[_Tensor]]:
    """The writer with every key and tensor announced, and the tensors still to draw."""
    writer = GGUFWriter(path=None, arch=spec.architecture)
    _write_hyperparameters(writer, spec)
    tensors = _plan_tensors(spec, _write_vocabulary(writer, spec))
    for tensor in tensors:
        writer.add_tensor_info(tensor.name, tensor.shape, tensor.dtype, _n_bytes(tensor), raw_dtype=tensor.raw_type)
    return writer, tensors


def _n_bytes(tensor: _Tensor) -> int:
    return int(np.prod(tensor.shape)) * tensor.dtype.itemsize


def synthetic_layout(spec: SyntheticSpec) -> list[TensorLayout]:
    """Every tensor ``spec`` writes, in file order, without drawing a weight: a full-size spec's
    shapes and size can be checked without writing gigabytes."""
    _, tensors = _prepare(spec)
    return [TensorLayout(t.name, t.raw_type or GGMLQuantizationType.F32, t.shape, _n_bytes(t)) for t in tensors]


def write_synthetic_model(path: Path, spec: SyntheticSpec = SyntheticSpec()) -> Path:
    """Write a model to ``path`` (atomically, streaming one tensor at a time) and return the path."""
    writer, tensors = _prepare(spec)
    path = Path(path)
    partial = partial_path(path)
    try:
        writer.write_header_to_file(path=partial)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for tensor in tensors:
            writer.write_tensor_data(tensor.draw())
        writer.close()
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path
