"""Synthetic model variants and range cases shared by the slicing tests."""

from __future__ import annotations

import mmap
from pathlib import Path

from gguf import GGMLQuantizationType as Quant

from meshnet.artifact.gguf_file import GGUFFile
from meshnet.artifact.slicing import SliceRole
from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.core.layers import LayerRange

# Layer counts 4 and 6, tied and untied embeddings, Q4_1 / Q8_0 / F16 weights.
SPECS: dict[str, SyntheticSpec] = {
    "4L-tied-q4_1": SyntheticSpec(n_layers=4),
    "6L-untied-q8_0": SyntheticSpec(n_layers=6, weight_type=Quant.Q8_0, tied_embeddings=False, seed=1),
    "6L-tied-f16": SyntheticSpec(n_layers=6, weight_type=Quant.F16, embedding_type=Quant.F16, seed=2),
    "4L-untied-f16": SyntheticSpec(
        n_layers=4, weight_type=Quant.F16, embedding_type=Quant.Q4_1, tied_embeddings=False, seed=3
    ),
}

RANGES: dict[int, list[tuple[LayerRange, SliceRole]]] = {
    4: [
        (LayerRange(0, 1), "head"),
        (LayerRange(0, 3), "head"),
        (LayerRange(1, 3), "middle"),
        (LayerRange(2, 4), "tail"),
        (LayerRange(3, 4), "tail"),
        (LayerRange(0, 4), "full"),
    ],
    6: [
        (LayerRange(0, 2), "head"),
        (LayerRange(2, 4), "middle"),
        (LayerRange(1, 5), "middle"),
        (LayerRange(4, 6), "tail"),
        (LayerRange(0, 6), "full"),
    ],
}

CASES = [(name, layers, role) for name, spec in SPECS.items() for layers, role in RANGES[spec.n_layers]]


def tensor_bytes(model: GGUFFile, name: str) -> bytes:
    """The raw on-disk bytes of one tensor."""
    info = model.tensors[name]
    with open(model.path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
        start = model.data_offset + info.offset
        return bytes(view[start : start + info.nbytes])


def flip_byte(path: Path, offset: int) -> None:
    """Invert every bit of one byte of ``path`` in place."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        value = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([value ^ 0xFF]))
