"""Gemma 3 (270M, 1B, 4B, 12B): sandwich-normed blocks, interleaved sliding-window attention.

Measured on the pinned llama.cpp (``src/models/gemma3.cpp``, ``llama-hparams.cpp``):
- which layers attend through the window comes from ``attention.sliding_window_pattern``: a
  period n (default 6; layer il is windowed iff ``il % n < n - 1``) or a per-layer array. The
  period is evaluated on the slice's *renumbered* index, so a cut not on the period would move
  the global layers. Every slice therefore carries the per-layer array of its own layers, which
  makes any cut bit-identical. A slice with no windowed layer drops ``attention.sliding_window``
  instead: llama.cpp asserts (aborting the process) when windowing is on but no layer uses it;
  its layers then use the same full-attention cache and base RoPE frequency as before.
- the ``sqrt(n_embd)`` input scale applies to token input only, never to ``batch.embd``; the
  head scales the rows it looks up itself (``token_input_scale``).
- the 27B model's attention scale is inferred from ``n_layer == 62``: a slice of it (or any
  62-layer slice of something else) would compute with the wrong scale, so both are refused.
- every slice: its blocks (Q/K norms, post-attention and post-FFN norms included);
- tail: ``output_norm`` and ``output.weight`` (absent: tied to ``token_embd``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshnet.artifact.architectures.base import (
    COMMON_PER_LAYER_KEYS,
    DENSE_ATTENTION,
    DENSE_FFN,
    ArchitectureAdapter,
    Metadata,
)
from meshnet.artifact.gguf_file import MetadataValue, ValueType
from meshnet.core.errors import ArtifactError, UnsupportedModelVariant
from meshnet.core.layers import LayerRange

DEFAULT_WINDOW_PERIOD = 6
LAYER_COUNT_OF_27B = 62
_WINDOW = "attention.sliding_window"
_PATTERN = "attention.sliding_window_pattern"


@dataclass(frozen=True)
class Gemma3Adapter(ArchitectureAdapter):
    def token_input_scale(self, n_embd: int) -> float:
        return math.sqrt(n_embd)

    def refuse_source(self, metadata: Metadata, n_layers: int, file_name: str) -> None:
        if n_layers == LAYER_COUNT_OF_27B:
            raise UnsupportedModelVariant(
                f"{file_name}: a {LAYER_COUNT_OF_27B}-layer gemma3 (the 27B shape) takes its attention scale "
                "from its layer count in llama.cpp, so its slices would compute differently; refusing it"
            )

    def refuse_slice(self, layers: LayerRange, n_layers: int) -> None:
        if len(layers) == LAYER_COUNT_OF_27B:
            raise UnsupportedModelVariant(
                f"a gemma3 slice of {LAYER_COUNT_OF_27B} layers ({layers}) would be taken for the 27B shape "
                "and get its attention scale; choose another cut"
            )

    def windowed_layers(self, metadata: Metadata, n_layers: int) -> list[bool]:
        """Per absolute layer: does it attend through the sliding window?"""
        window = metadata.get(self.key(_WINDOW))
        if window is None or not window.value:
            return [False] * n_layers
        pattern = metadata.get(self.key(_PATTERN))
        if pattern is not None and pattern.type == ValueType.ARRAY:
            return [bool(flag) for flag in pattern.value]
        period = DEFAULT_WINDOW_PERIOD if pattern is None else pattern.value
        if not isinstance(period, int) or period < 0:
            raise ArtifactError(f"{self.key(_PATTERN)} = {period!r} is not a layer period")
        return [period == 0 or layer % period < period - 1 for layer in range(n_layers)]

    def rewrite_slice_metadata(
        self, metadata: dict[str, MetadataValue], layers: LayerRange, n_layers: int
    ) -> dict[str, MetadataValue]:
        windowed = self.windowed_layers(metadata, n_layers)[layers.start : layers.stop]
        metadata = super().rewrite_slice_metadata(metadata, layers, n_layers)
        if any(windowed):
            metadata[self.key(_PATTERN)] = MetadataValue(ValueType.ARRAY, windowed, ValueType.BOOL)
        else:
            metadata.pop(self.key(_WINDOW), None)
            metadata.pop(self.key(_PATTERN), None)
        return metadata


GEMMA3 = Gemma3Adapter(
    name="gemma3",
    version="1",
    layer_tensors=frozenset(
        f"{name}.weight"
        for name in (*DENSE_ATTENTION, *DENSE_FFN, "attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm")
    ),
    per_layer_keys=(*COMMON_PER_LAYER_KEYS, _PATTERN),
)
