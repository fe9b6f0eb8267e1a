"""Publishing and assembly: per-block artifacts, slices assembled from them byte-identical to
``meshnet slice`` in every family, resumable and refusing bad pieces."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from artifact_published import publish_model

from meshnet.artifact.assemble import (
    DiskFull,
    PieceRejected,
    SliceBuilder,
    assemble_from,
    assemble_published,
    read_published_piece,
)
from meshnet.artifact.cache import SliceCache
from meshnet.artifact.hashing import file_sha256
from meshnet.artifact.manifest import needed_artifacts
from meshnet.artifact.slicing import verify_slice, write_embedding_table, write_slice
from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.core.errors import ArtifactError
from meshnet.core.layers import LayerRange

FAMILIES = {
    "llama": SyntheticSpec(),
    "qwen2-untied": SyntheticSpec(architecture="qwen2", per_layer_arrays=True, tied_embeddings=False),
    "qwen3moe": SyntheticSpec(architecture="qwen3moe", per_layer_arrays=True, tied_embeddings=False),
    "gemma3": SyntheticSpec(architecture="gemma3", n_layers=7, head_dim=32, sliding_window=8),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_assembled_slices_equal_cut_slices(family: str, synthetic_model_factory: Any, tmp_path: Path) -> None:
    spec = FAMILIES[family]
    published = publish_model(synthetic_model_factory(spec), tmp_path)
    manifest = published.manifest
    assert manifest.source.sha256 == file_sha256(published.source)
    assert len(manifest.of_kind("layer")) == spec.n_layers
    stop = spec.n_layers
    for layers in (LayerRange(0, 2), LayerRange(2, stop - 1), LayerRange(stop - 1, stop), LayerRange(0, stop)):
        cache = SliceCache(tmp_path / "cache")
        files = assemble_published(manifest, published.directory, layers, cache, tmp_path / "w")
        reference = tmp_path / f"reference-{layers.start}-{layers.stop}.gguf"
        provenance = write_slice(published.source, layers, reference)
        assert files.slice.read_bytes() == reference.read_bytes(), (family, str(layers))
        assert verify_slice(files.slice)[1].content_sha256 == provenance.content_sha256
        if layers.is_head() and not layers.is_tail(stop):
            table = tmp_path / "reference-embeddings.gguf"
            write_embedding_table(published.source, table)
            assert files.embeddings is not None and files.embeddings.read_bytes() == table.read_bytes()
    assert list((tmp_path / "w").iterdir()) == []  # the sparse copies are gone: the range is stored once


def test_a_rerun_fetches_only_what_is_missing(tiny_model: Path, tmp_path: Path) -> None:
    published = publish_model(tiny_model, tmp_path)
    layers = LayerRange(1, 3)
    reads: list[Any] = []
    fail_at = [6]

    def read(piece: Any) -> bytes:
        reads.append(piece)
        if len(reads) == fail_at[0]:
            fail_at[0] = -1
            raise ConnectionError("holder went away")
        return read_published_piece(published.directory, piece)

    with SliceBuilder(published.manifest, layers, tmp_path / "w") as builder, pytest.raises(ConnectionError):
        assemble_from(builder, read, SliceCache(tmp_path / "cache"))
    partial = next((tmp_path / "w").iterdir())
    assert partial.name.endswith(".partial")  # nothing that looks complete
    first = len(reads) - 1
    reads.clear()
    with SliceBuilder(published.manifest, layers, tmp_path / "w") as builder:
        total = len(builder.header_pieces()) + len(builder.body_pieces())
        files = assemble_from(builder, read, SliceCache(tmp_path / "cache"))
    assert len(reads) == total - first
    reference = tmp_path / "reference.gguf"
    write_slice(tiny_model, layers, reference)
    assert files.slice.read_bytes() == reference.read_bytes()


def test_a_tampered_artifact_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    published = publish_model(tiny_model, tmp_path)
    damaged = tmp_path / "damaged"
    shutil.copytree(published.directory, damaged)
    layer = published.manifest.of_kind("layer")[1]
    artifact = damaged / "artifacts" / layer.sha256
    data = bytearray(artifact.read_bytes())
    data[len(data) // 2] ^= 0x01
    artifact.write_bytes(bytes(data))
    with pytest.raises(PieceRejected, match="does not match"):
        assemble_published(published.manifest, damaged, LayerRange(0, 2), SliceCache(tmp_path / "c"), tmp_path / "w")
    assert not any((tmp_path / "c").rglob("*.gguf"))


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 KiB tmpfs (root only): smaller than the pieces a range needs."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mount)]).returncode:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_leaves_nothing_that_looks_complete(tiny_model: Path, tmp_path: Path, small_disk: Path) -> None:
    published = publish_model(tiny_model, tmp_path)
    layers = LayerRange(0, 4)
    assert sum(e.size for e in needed_artifacts(published.manifest, layers)) > 48 << 10
    with pytest.raises(DiskFull):
        assemble_published(published.manifest, published.directory, layers, SliceCache(small_disk / "c"), small_disk)
    assert all(path.name.endswith(".partial") for path in small_disk.rglob("*") if path.is_file())


def test_a_slice_is_not_published(tiny_model: Path, tmp_path: Path) -> None:
    cut = tmp_path / "slice.gguf"
    write_slice(tiny_model, LayerRange(0, 2), cut)
    with pytest.raises(ArtifactError, match="already a meshnet slice"):
        publish_model(cut, tmp_path)
