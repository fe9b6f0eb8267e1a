"""Qwen3-MoE (Qwen3-30B-A3B and kin): Qwen3 attention, a routed mixture of experts per block.

Each block holds its router (``ffn_gate_inp``) and all its experts stacked in three 3-D tensors,
so a shard owns exactly the experts of its own layers. The graph (``src/models/qwen3moe.cpp``)
normalizes the top-k weights itself; the expert counts are scalars or per-layer arrays
(``expert_used_count``, ``expert_feed_forward_length``) that a slice cuts to its range.
- every slice: its blocks, router and experts;
- tail: ``output_norm`` and ``output.weight`` (absent when tied).
"""

from __future__ import annotations

from meshnet.artifact.architectures.base import COMMON_PER_LAYER_KEYS, DENSE_ATTENTION, ArchitectureAdapter

_MOE_FFN = ("ffn_norm", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")

QWEN3MOE = ArchitectureAdapter(
    name="qwen3moe",
    version="1",
    layer_tensors=frozenset(f"{name}.weight" for name in (*DENSE_ATTENTION, "attn_q_norm", "attn_k_norm", *_MOE_FFN)),
    per_layer_keys=(*COMMON_PER_LAYER_KEYS, "expert_feed_forward_length"),
)
