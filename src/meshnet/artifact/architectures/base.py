"""What an architecture adapter must say about its GGUF tensors and metadata."""

from __future__ import annotations

import re
from dataclasses import dataclass

_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class ArchitectureAdapter:
    name: str
    """``general.architecture`` value this adapter handles."""
    version: str
    """Bumped whenever slicing or boundary semantics change; part of the recipe fingerprint."""
    token_embedding: str = "token_embd.weight"
    output_norm: str = "output_norm.weight"
    output: str = "output.weight"
    global_tensors: tuple[str, ...] = ()
    """Tensors every layer reads (e.g. llama3 ``rope_freqs``): copied into every slice."""
    index_dependent_keys: tuple[str, ...] = ()
    """Per-layer metadata arrays that must be cut to the slice's range when renumbering."""
    embedding_scale: float = 1.0
    """Factor the graph applies to looked-up embeddings (Gemma uses sqrt(n_embd)); 1.0 for llama."""

    @staticmethod
    def layer_of(tensor_name: str) -> tuple[int, str] | None:
        """``blk.N.rest`` -> ``(N, rest)``; None for tensors outside the repeated blocks."""
        match = _BLOCK.match(tensor_name)
        return (int(match.group(1)), match.group(2)) if match else None

    def block_count_key(self) -> str:
        return f"{self.name}.block_count"

    def vocab_size_key(self) -> str:
        return f"{self.name}.vocab_size"

    def embedding_length_key(self) -> str:
        return f"{self.name}.embedding_length"
