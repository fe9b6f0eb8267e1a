"""Dense Llama (SmolLM2, Llama 2/3, Mistral-style dense GGUFs): homogeneous layers.

Every block has the same shape and nothing in the graph depends on the absolute layer index, so
renumbering ``blk.A..B-1`` to ``blk.0..`` is safe; only ``block_count`` changes. ``rope_freqs``
(llama3 rope scaling) is read by every layer and so goes into every slice.
"""

from __future__ import annotations

from meshnet.artifact.architectures.base import ArchitectureAdapter

LLAMA = ArchitectureAdapter(
    name="llama",
    version="1",
    global_tensors=("rope_freqs.weight",),
)
