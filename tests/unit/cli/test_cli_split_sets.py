"""``meshnet slice`` and ``meshnet publish`` given a gguf-split set (its directory or first part),
and a clear typed error naming the part when one is missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "artifact"))
from artifact_split import write_split_set

from meshnet.artifact.gguf_split import model_sha256, open_model
from meshnet.artifact.manifest_codec import decode_manifest
from meshnet.artifact.slicing import verify_slice, write_slice
from meshnet.cli.main import main
from meshnet.core.layers import LayerRange


def test_slice_and_publish_take_a_split_set(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parts = write_split_set(tiny_model, tmp_path / "set", max_tensors=10)
    identity = model_sha256(open_model(parts[0]))
    out = tmp_path / "head.gguf"
    cut = ["--data-dir", str(tmp_path), "slice", "--layers", "0:2", "--output", str(out)]
    assert main([*cut, str(parts[0].parent)]) == 0
    reference = tmp_path / "reference.gguf"
    write_slice(tiny_model, LayerRange(0, 2), reference, source_sha256=identity)
    assert out.read_bytes() == reference.read_bytes()  # the unsplit file's slice, under the set's identity
    assert verify_slice(tmp_path / "head.embeddings.gguf", source_sha256=identity)[1].role == "embedding"
    publish = ["--data-dir", str(tmp_path), "publish", str(parts[0]), "--out", str(tmp_path / "pub"), "--name", "tiny"]
    assert main(publish) == 0
    manifest = decode_manifest((tmp_path / "pub" / "manifest.json").read_bytes())
    assert manifest.source.sha256 == identity
    parts[1].unlink()
    capsys.readouterr()
    assert main([*cut, str(parts[0])]) == 2
    assert f"[invalid_split_set]: part 2 of {len(parts)} of the gguf-split set, {parts[1].name}, is missing" in (
        capsys.readouterr().err
    )
