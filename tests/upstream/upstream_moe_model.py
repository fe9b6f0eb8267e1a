"""A tiny random mixture-of-experts GGUF for the expert-parallel repro.

meshnet's synthetic models are dense; the expert-parallel hook needs a graph that runs
``build_moe_ffn``. The llama architecture takes experts when ``llama.expert_count`` is set, so this
writes a 2-layer llama with 4 experts, 2 used per token, shaped like a meshnet middle slice
(vocabulary-less, 1-row placeholder embedding): the repro feeds it boundary rows, as an expert
shard would receive them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

N_EMBD = 64
N_FF = 64
N_EXPERT = 4
N_EXPERT_USED = 2
N_LAYERS = 2


def write_moe_model(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(path=None, arch="llama")
    writer.add_context_length(512)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYERS)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_dimension_count(N_EMBD // 4)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_expert_count(N_EXPERT)
    writer.add_expert_used_count(N_EXPERT_USED)
    writer.add_vocab_size(1)
    writer.add_tokenizer_model("none")

    def add(name: str, shape: tuple[int, ...], qtype: GGMLQuantizationType = GGMLQuantizationType.F32) -> None:
        # numpy order: outermost first, row length last
        values = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        if qtype == GGMLQuantizationType.F32:
            writer.add_tensor(name, values)
        else:
            writer.add_tensor(name, quantize(values, qtype), raw_dtype=qtype)

    writer.add_tensor("token_embd.weight", np.zeros((1, N_EMBD), np.float32))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    for layer in range(N_LAYERS):
        prefix = f"blk.{layer}."
        writer.add_tensor(prefix + "attn_norm.weight", np.ones(N_EMBD, np.float32))
        writer.add_tensor(prefix + "ffn_norm.weight", np.ones(N_EMBD, np.float32))
        add(prefix + "attn_q.weight", (N_EMBD, N_EMBD))
        add(prefix + "attn_k.weight", (N_EMBD // 2, N_EMBD))
        add(prefix + "attn_v.weight", (N_EMBD // 2, N_EMBD))
        add(prefix + "attn_output.weight", (N_EMBD, N_EMBD))
        add(prefix + "ffn_gate_inp.weight", (N_EXPERT, N_EMBD))
        add(prefix + "ffn_gate_exps.weight", (N_EXPERT, N_FF, N_EMBD), GGMLQuantizationType.Q8_0)
        add(prefix + "ffn_up_exps.weight", (N_EXPERT, N_FF, N_EMBD), GGMLQuantizationType.Q8_0)
        add(prefix + "ffn_down_exps.weight", (N_EXPERT, N_EMBD, N_FF), GGMLQuantizationType.Q8_0)
    writer.write_header_to_file(path=Path(path))
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
