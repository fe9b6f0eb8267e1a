"""The slice content hash covers metadata as well as tensor bytes."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from meshnet.artifact.slicing import verify_slice, write_slice
from meshnet.artifact.synthetic import write_synthetic_model
from meshnet.core.errors import ProvenanceMismatch
from meshnet.core.layers import LayerRange


def test_a_damaged_hyperparameter_fails_verification(tmp_path: Path) -> None:
    source = write_synthetic_model(tmp_path / "tiny.gguf")
    out = tmp_path / "middle.gguf"
    write_slice(source, LayerRange(1, 3), out)
    verify_slice(out, layers=LayerRange(1, 3))
    raw = bytearray(out.read_bytes())
    rope_base = struct.pack("<f", 10000.0)
    at = raw.find(rope_base)
    assert at > 0
    raw[at : at + 4] = struct.pack("<f", 10001.0)
    out.write_bytes(bytes(raw))
    with pytest.raises(ProvenanceMismatch, match="metadata"):
        verify_slice(out, layers=LayerRange(1, 3))
