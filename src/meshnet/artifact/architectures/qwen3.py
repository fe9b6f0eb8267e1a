"""Qwen3 (dense): Llama-shaped blocks plus per-head RMS norms on Q and K, no biases.

As for Qwen2, nothing in ``src/models/qwen3.cpp`` of the pinned llama.cpp depends on the
absolute layer index except per-layer arrays, which a slice cuts. A reranker's ``cls_out``
head is not placed by this adapter, so such a file is refused rather than sliced without it.
- every slice: its blocks (``attn_q_norm``/``attn_k_norm`` included);
- tail: ``output_norm`` and ``output.weight`` (absent when tied).
"""

from __future__ import annotations

from meshnet.artifact.architectures.base import DENSE_ATTENTION, DENSE_FFN, ArchitectureAdapter

QWEN3 = ArchitectureAdapter(
    name="qwen3",
    version="1",
    layer_tensors=frozenset(f"{name}.weight" for name in (*DENSE_ATTENTION, *DENSE_FFN, "attn_q_norm", "attn_k_norm")),
)
