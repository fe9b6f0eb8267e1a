"""What an architecture adapter must say about its GGUF tensors and metadata.

A slice renumbers its blocks from 0, so whatever llama.cpp ties to the absolute layer index
would silently change the arithmetic. An adapter states, for one family of the pinned
llama.cpp:
- which tensors each role owns: every slice owns its blocks (``layer_tensors`` names the
  suffixes a block may hold) and the ``global_tensors``; the head's token table lives in a
  separate embedding file; the tail owns ``output_norm`` and ``tail_tensors``;
- which metadata keys are per-layer (``per_layer_keys``): llama.cpp reads them as an array of
  exactly ``block_count`` entries when stored as arrays, so a slice cuts them to its range;
- which variants or cuts it refuses, and any further rewrite of a slice's metadata (hooks
  ``refuse_source``, ``refuse_slice``, ``rewrite_slice_metadata``; Gemma 3 uses all three).
Anything an adapter does not name fails closed: an unknown tensor could be a feature the
slicer would drop or misplace.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from meshnet.artifact.gguf_file import MetadataValue, ValueType
from meshnet.core.errors import LayerMetadataMismatch, UnsupportedModelVariant
from meshnet.core.layers import LayerRange

_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")

# Keys every family of the pinned llama.cpp reads with get_key_or_arr(..., n_layer): an array
# value must be block_count long (llama-model.cpp, load_hparams).
COMMON_PER_LAYER_KEYS = (
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "expert_used_count",
)
DENSE_ATTENTION = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output")
DENSE_FFN = ("ffn_norm", "ffn_gate", "ffn_up", "ffn_down")

Metadata = Mapping[str, MetadataValue]


@dataclass(frozen=True)
class ArchitectureAdapter:
    name: str
    """``general.architecture`` value this adapter handles."""
    version: str
    """Bumped whenever slicing or boundary semantics change; part of the recipe fingerprint."""
    layer_tensors: frozenset[str]
    """Tensor names inside ``blk.N.`` (with their ``.weight``/``.bias`` suffix) a block may hold."""
    token_embedding: str = "token_embd.weight"
    output_norm: str = "output_norm.weight"
    tail_tensors: tuple[str, ...] = ("output.weight",)
    """Optional LM-head tensors besides ``output_norm`` (absent when the head is tied)."""
    global_tensors: tuple[str, ...] = ()
    """Tensors every layer reads (e.g. llama3 ``rope_freqs``): copied into every slice."""
    per_layer_keys: tuple[str, ...] = COMMON_PER_LAYER_KEYS
    """Key suffixes (after ``{arch}.``) whose array values hold one entry per layer."""

    @staticmethod
    def layer_of(tensor_name: str) -> tuple[int, str] | None:
        """``blk.N.rest`` -> ``(N, rest)``; None for tensors outside the repeated blocks."""
        match = _BLOCK.match(tensor_name)
        return (int(match.group(1)), match.group(2)) if match else None

    @property
    def label(self) -> str:
        """``name:version``, as recorded in slice provenance and recipes."""
        return f"{self.name}:{self.version}"

    def key(self, suffix: str) -> str:
        return f"{self.name}.{suffix}"

    def block_count_key(self) -> str:
        return self.key("block_count")

    def vocab_size_key(self) -> str:
        return self.key("vocab_size")

    def embedding_length_key(self) -> str:
        return self.key("embedding_length")

    def token_input_scale(self, n_embd: int) -> float:
        """Factor the graph applies to *token* input only; the head applies it to looked-up rows
        itself, because llama.cpp leaves embedding input unscaled. 1.0 for most families."""
        return 1.0

    # -- checks and rewrites --------------------------------------------------------------

    def check_tensors(self, names: list[str], file_name: str) -> None:
        """Refuse any tensor this adapter does not account for."""
        known_outside = {self.token_embedding, self.output_norm, *self.tail_tensors, *self.global_tensors}
        unknown = []
        for name in names:
            located = self.layer_of(name)
            if (located is None and name not in known_outside) or (
                located is not None and located[1] not in self.layer_tensors
            ):
                unknown.append(name)
        if unknown:
            raise UnsupportedModelVariant(
                f"{file_name}: the {self.label} adapter does not know the tensors {sorted(unknown)[:6]}; "
                "refusing to slice a variant it cannot place"
            )

    def check_layer_metadata(self, metadata: Metadata, n_layers: int, file_name: str) -> None:
        """Every per-layer array must hold exactly ``n_layers`` entries."""
        for suffix in self.per_layer_keys:
            entry = metadata.get(self.key(suffix))
            if entry is not None and entry.type == ValueType.ARRAY and len(entry.value) != n_layers:
                raise LayerMetadataMismatch(
                    f"{file_name}: {self.key(suffix)} holds {len(entry.value)} per-layer values but the "
                    f"file has {n_layers} blocks"
                )

    def refuse_source(self, metadata: Metadata, n_layers: int, file_name: str) -> None:
        """Raise ``UnsupportedModelVariant`` for a model of this family the engine cannot split."""

    def refuse_slice(self, layers: LayerRange, n_layers: int) -> None:
        """Raise ``UnsupportedModelVariant`` for a cut that would compute differently."""

    def rewrite_slice_metadata(
        self, metadata: dict[str, MetadataValue], layers: LayerRange, n_layers: int
    ) -> dict[str, MetadataValue]:
        """The slice's metadata from a copy of the source's: per-layer arrays cut to ``layers``."""
        for suffix in self.per_layer_keys:
            entry = metadata.get(self.key(suffix))
            if entry is not None and entry.type == ValueType.ARRAY:
                metadata[self.key(suffix)] = MetadataValue(
                    entry.type, entry.value[layers.start : layers.stop], entry.item_type
                )
        return metadata
