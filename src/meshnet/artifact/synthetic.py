"""Tiny random GGUF models written with ``gguf.GGUFWriter``.

They carry the default test suite and the engine's start-up certification: small enough to
write and run in milliseconds, real enough that llama.cpp loads them through the same code
paths as a downloaded model (quantized blocks, a real SentencePiece-style vocabulary, a chat
template). Weights are drawn from a seeded generator, so a given spec always writes the same bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import quantize

from meshnet.artifact.hashing import partial_path

TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@dataclass(frozen=True)
class SyntheticSpec:
    architecture: str = "llama"
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


def _vocabulary() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [TokenType.BYTE] * 256
    pieces = ["▁", "▁the", "▁a", "▁is", "▁of", "▁and", "▁to", "▁in", "e", "t", "a", "o", "n", "s", "h", "r"]
    pieces += [chr(c) for c in range(ord("b"), ord("z") + 1) if chr(c) not in pieces]
    tokens += pieces
    types += [TokenType.NORMAL] * len(pieces)
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    return tokens, scores, [int(t) for t in types]


def write_synthetic_model(path: Path, spec: SyntheticSpec = SyntheticSpec()) -> Path:
    """Write a tiny model to ``path`` (atomically) and return the path."""
    rng = np.random.default_rng(spec.seed)
    tokens, scores, types = _vocabulary()
    n_vocab = len(tokens)
    writer = GGUFWriter(path=None, arch=spec.architecture)
    writer.add_name(f"meshnet-synthetic-{spec.architecture}-{spec.n_layers}L")
    writer.add_context_length(spec.n_ctx_train)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layers)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_rope_dimension_count(spec.n_embd // spec.n_head)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_chat_template(TINY_CHAT_TEMPLATE)

    def add(name: str, shape: tuple[int, ...], qtype: GGMLQuantizationType, scale: float = 0.08) -> None:
        # shape is numpy order: (rows, row_length)
        values = (rng.standard_normal(shape) * scale).astype(np.float32)
        if qtype == GGMLQuantizationType.F32:
            writer.add_tensor(name, values)
        else:
            writer.add_tensor(name, quantize(values, qtype), raw_dtype=qtype)

    def add_norm(name: str) -> None:
        writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(spec.n_embd)).astype(np.float32))

    head_dim = spec.n_embd // spec.n_head
    add("token_embd.weight", (n_vocab, spec.n_embd), spec.embedding_type, scale=0.5)
    for layer in range(spec.n_layers):
        prefix = f"blk.{layer}."
        add_norm(prefix + "attn_norm.weight")
        add(prefix + "attn_q.weight", (spec.n_embd, spec.n_embd), spec.weight_type)
        add(prefix + "attn_k.weight", (spec.n_head_kv * head_dim, spec.n_embd), spec.weight_type)
        add(prefix + "attn_v.weight", (spec.n_head_kv * head_dim, spec.n_embd), spec.weight_type)
        add(prefix + "attn_output.weight", (spec.n_embd, spec.n_embd), spec.weight_type)
        add_norm(prefix + "ffn_norm.weight")
        add(prefix + "ffn_gate.weight", (spec.n_ff, spec.n_embd), spec.weight_type)
        add(prefix + "ffn_up.weight", (spec.n_ff, spec.n_embd), spec.weight_type)
        add(prefix + "ffn_down.weight", (spec.n_embd, spec.n_ff), spec.weight_type)
    add_norm("output_norm.weight")
    if not spec.tied_embeddings:
        add("output.weight", (n_vocab, spec.n_embd), spec.weight_type)

    path = Path(path)
    partial = partial_path(path)
    try:
        writer.write_header_to_file(path=partial)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path
