"""Qwen2 / Qwen2.5 (dense): Llama-shaped blocks plus Q/K/V biases.

In the pinned llama.cpp (``src/models/qwen2.cpp``) the layer index is used only for per-layer
tensors, the KV layer, tensor names and the last layer's output-row pruning; per-layer
hyper-parameters come from arrays a slice cuts to its range. ``batch.embd`` input is unscaled.
- every slice: its blocks (attention biases included);
- tail: ``output_norm``, ``output.weight`` (absent when tied) and the optional ``output.bias``.
"""

from __future__ import annotations

from meshnet.artifact.architectures.base import DENSE_ATTENTION, DENSE_FFN, ArchitectureAdapter

QWEN2 = ArchitectureAdapter(
    name="qwen2",
    version="1",
    layer_tensors=frozenset(
        [f"{name}.weight" for name in (*DENSE_ATTENTION, *DENSE_FFN)] + [f"attn_{x}.bias" for x in ("q", "k", "v")]
    ),
    tail_tensors=("output.weight", "output.bias"),
)
