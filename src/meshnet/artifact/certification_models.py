"""The tiny synthetic models that certify a served model's family and quantization types.

A worker must not serve a recipe whose kernels were never checked split against whole on this
build, so the models mirror what it is about to serve: the same architecture (and so the same
graph and adapter), one model per ggml weight type the source's blocks use, each with the
source's token-table type (which the head dequantizes in NumPy). Types the synthetic writer
cannot produce fail closed.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gguf import GGMLQuantizationType

from meshnet.artifact.gguf_split import open_model
from meshnet.artifact.slicing import model_dimensions
from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.artifact.synthetic_quants import K_QUANTS, WRITABLE
from meshnet.core.errors import UnsupportedModelVariant
from meshnet.core.layers import LayerRange

DEFAULT_SPEC = SyntheticSpec()
"""Certifies the engine itself when no model is named: llama, Q4_1 weights, Q8_0 embeddings."""

_FAMILY_SHAPES: dict[str, SyntheticSpec] = {
    "llama": SyntheticSpec(),
    "qwen2": SyntheticSpec(architecture="qwen2", tied_embeddings=False),
    "qwen3": SyntheticSpec(architecture="qwen3", head_dim=32),
    "qwen3moe": SyntheticSpec(architecture="qwen3moe", per_layer_arrays=True),
    # Default window period 6 over 7 layers: layer 5 global, the rest windowed.
    "gemma3": SyntheticSpec(architecture="gemma3", n_layers=7, head_dim=32, sliding_window=8),
}


def certification_cut(spec: SyntheticSpec) -> tuple[LayerRange, ...]:
    """Head, middle and tail ranges; for gemma3 off the window period, with the global layer inside."""
    n = spec.n_layers
    if spec.architecture == "gemma3":
        return (LayerRange(0, 3), LayerRange(3, n - 1), LayerRange(n - 1, n))
    return (LayerRange(0, n // 2), LayerRange(n // 2, n - 1), LayerRange(n - 1, n))


def served_types(path: Path) -> tuple[str, tuple[GGMLQuantizationType, ...], GGMLQuantizationType]:
    """(architecture, weight types of the blocks' matrices, token-table type) of a source model."""
    model = open_model(path)
    adapter, _, _ = model_dimensions(model)
    weights = sorted(
        {
            GGMLQuantizationType(t.ggml_type)
            for t in model.tensors.values()
            if adapter.layer_of(t.name) and len(t.shape) > 1
        }
    )
    embedding = model.tensors.get(adapter.token_embedding)
    if embedding is None:
        raise UnsupportedModelVariant(f"{Path(path).name}: no {adapter.token_embedding!r} to certify the head with")
    return adapter.name, tuple(weights), GGMLQuantizationType(embedding.ggml_type)


def certification_specs(path: Path) -> list[SyntheticSpec]:
    """One tiny model per weight type the source at ``path`` uses, of its family."""
    architecture, weights, embedding = served_types(path)
    unwritable = [t.name for t in (*weights, embedding) if t not in WRITABLE]
    if unwritable:
        raise UnsupportedModelVariant(
            f"{Path(path).name} uses {', '.join(sorted(set(unwritable)))}, which start-up certification "
            "cannot reproduce on a synthetic model; refusing to serve an uncertified quantization"
        )
    base = _FAMILY_SHAPES[architecture]
    specs = []
    for weight in weights or (base.weight_type,):
        spec = replace(base, weight_type=weight, embedding_type=embedding)
        if weight in K_QUANTS or embedding in K_QUANTS:
            # K-quant blocks hold 256 values: rows that short keep the type instead of falling back.
            spec = replace(spec, n_embd=256, n_ff=256, n_ff_expert=256, head_dim=None if spec.head_dim is None else 64)
        specs.append(spec)
    return specs
