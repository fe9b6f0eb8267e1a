"""Dense Llama (SmolLM2, Llama 2/3, Mistral-style dense GGUFs): homogeneous layers.

Every block has the same shape and nothing in the graph depends on the absolute layer index
beyond per-layer hyper-parameter arrays, so renumbering ``blk.A..B-1`` to ``blk.0..`` is safe
once those arrays are cut. ``rope_freqs`` (llama3 rope scaling) is read by every layer and so
goes into every slice.
- head: its blocks (the token table is a separate embedding file);
- middle: its blocks and ``rope_freqs``;
- tail: its blocks, ``output_norm``, ``output.weight`` (absent when tied to ``token_embd``).
"""

from __future__ import annotations

from meshnet.artifact.architectures.base import DENSE_ATTENTION, DENSE_FFN, ArchitectureAdapter

LLAMA = ArchitectureAdapter(
    name="llama",
    version="2",
    layer_tensors=frozenset(f"{name}.weight" for name in (*DENSE_ATTENTION, *DENSE_FFN)),
    global_tensors=("rope_freqs.weight",),
)
