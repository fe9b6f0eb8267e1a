"""Tensor payloads for synthetic models in any ggml type the certified families use.

``gguf`` can quantize the legacy 32-element block types (Q4_0 … Q8_0) but not the K-quants, so
K-quant tensors are written as random *blocks*: random quant bytes with a small super-block scale
patched in. They are not a quantization of anything, but llama.cpp reads and multiplies them
through exactly the kernels a downloaded Q4_K_M model uses, which is all a split-exactness test
needs. A tensor whose row length does not fit the type's block falls back to Q8_0, as
llama-quantize falls back for such rows.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quantize

from meshnet.core.errors import InvalidArgument

FALLBACK = GGMLQuantizationType.Q8_0

# ggml type -> (byte offsets of the fp16 scale fields in a block, typical |weight| per unit
# scale, offset of the "min" field for the types that subtract one, its ratio to d).
# Ratios keep weights near zero-mean with a spread of about `scale` (block_q*_K in ggml-common.h).
_K_LAYOUT: dict[GGMLQuantizationType, tuple[int, float, int | None, float]] = {
    GGMLQuantizationType.Q4_K: (0, 300.0, 2, 7.5),
    GGMLQuantizationType.Q5_K: (0, 600.0, 2, 15.5),
    GGMLQuantizationType.Q6_K: (208, 1300.0, None, 0.0),
}
K_QUANTS = tuple(_K_LAYOUT)
# Legacy block types written as random blocks when asked (no quantization pass): value = (q - 8) d
# for Q4_0 (|q - 8| ~ 4.6), q d for Q8_0 (int8, ~74).
_LEGACY_RANDOM: dict[GGMLQuantizationType, tuple[int, float, int | None, float]] = {
    GGMLQuantizationType.Q4_0: (0, 4.6, None, 0.0),
    GGMLQuantizationType.Q8_0: (0, 74.0, None, 0.0),
}
LEGACY_QUANTS = (
    GGMLQuantizationType.F32,
    GGMLQuantizationType.F16,
    GGMLQuantizationType.Q4_0,
    GGMLQuantizationType.Q4_1,
    GGMLQuantizationType.Q5_0,
    GGMLQuantizationType.Q5_1,
    GGMLQuantizationType.Q8_0,
)
WRITABLE = (*LEGACY_QUANTS, *K_QUANTS)


def effective_type(qtype: GGMLQuantizationType, row_length: int) -> GGMLQuantizationType:
    """``qtype``, or the fallback when a row of ``row_length`` does not split into its blocks."""
    block = GGML_QUANT_SIZES[qtype][0]
    return qtype if row_length % block == 0 else FALLBACK


def payload_layout(
    shape: tuple[int, ...], qtype: GGMLQuantizationType
) -> tuple[tuple[int, ...], np.dtype, GGMLQuantizationType]:
    """The numpy shape and dtype ``random_payload`` returns for ``shape`` as ``qtype``, and the
    type used, without drawing anything (a streaming writer announces tensors first)."""
    if qtype not in WRITABLE:
        raise InvalidArgument(f"synthetic models cannot hold {qtype.name} tensors (writable: {_names()})")
    qtype = effective_type(qtype, shape[-1])
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return shape, np.dtype(np.float32 if qtype == GGMLQuantizationType.F32 else np.float16), qtype
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    return (*shape[:-1], shape[-1] // block_size * type_size), np.dtype(np.uint8), qtype


def random_payload(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    qtype: GGMLQuantizationType,
    scale: float,
    random_blocks: bool = False,
) -> tuple[np.ndarray, GGMLQuantizationType]:
    """Seeded random weights of numpy ``shape`` (outermost first) stored as ``qtype``.

    Returns the array to hand to ``GGUFWriter.add_tensor`` and the type actually used.
    ``random_blocks`` fills Q4_0/Q8_0 with random blocks instead of quantizing random floats.
    """
    if qtype not in WRITABLE:
        raise InvalidArgument(f"synthetic models cannot hold {qtype.name} tensors (writable: {_names()})")
    qtype = effective_type(qtype, shape[-1])
    if qtype in _K_LAYOUT:
        return _random_blocks(rng, shape, qtype, scale, _K_LAYOUT[qtype]), qtype
    if random_blocks and qtype in _LEGACY_RANDOM:
        blocks = _random_blocks(rng, shape, qtype, scale, _LEGACY_RANDOM[qtype])
        return _signed_scales(blocks.reshape(-1, GGML_QUANT_SIZES[qtype][1])).reshape(blocks.shape), qtype
    values = (rng.standard_normal(shape) * scale).astype(np.float32)
    if qtype == GGMLQuantizationType.F32:
        return values, qtype
    return quantize(values, qtype), qtype


def _random_blocks(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    qtype: GGMLQuantizationType,
    scale: float,
    layout: tuple[int, float, int | None, float],
) -> np.ndarray:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    d_offset, spread, min_offset, min_ratio = layout
    n_blocks = int(np.prod(shape[:-1])) * (shape[-1] // block_size)
    # blocks: [n_blocks, type_size] raw bytes; quants and sub-block scales uniformly random.
    blocks = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    d = np.float16(scale / spread)
    blocks[:, d_offset : d_offset + 2] = np.frombuffer(d.tobytes(), np.uint8)
    if min_offset is not None:
        blocks[:, min_offset : min_offset + 2] = np.frombuffer(np.float16(d * min_ratio).tobytes(), np.uint8)
    return blocks.reshape(*shape[:-1], shape[-1] // block_size * type_size)


def _signed_scales(blocks: np.ndarray) -> np.ndarray:
    """Flip the scale's sign in about half the blocks (by a bit of the block's own random quants).

    Uniform unsigned quants average (q - 8) = -0.5, so every block of one scale leans negative:
    a matrix of them adds a common all-ones component that grows along the residual stream
    until every position's hidden state points the same way and greedy decoding repeats one
    token whatever the prompt. Random signs centre each matrix on zero."""
    negative = (blocks[:, 2] & 1).astype(bool)
    blocks[negative, 1] |= 0x80  # the fp16 sign bit of the scale at offset 0 (little-endian)
    return blocks


def _names() -> str:
    return ", ".join(t.name for t in WRITABLE)
