"""gguf-split sets opened as one model: the same tensors, description and slices as the unsplit
file, one identity over the parts, a part missing, damaged, out of order or foreign refused by
name, and a published set assembled into the slices ``meshnet slice`` cuts from it."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from artifact_published import publish_model
from artifact_split import write_split_set

from meshnet.artifact.assemble import assemble_published
from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import decode_work, describe_model
from meshnet.artifact.footprint import memory_footprint
from meshnet.artifact.gguf_file import parse_gguf
from meshnet.artifact.gguf_split import model_sha256, open_model
from meshnet.artifact.hashing import file_sha256
from meshnet.artifact.manifest import needed_artifacts
from meshnet.artifact.slicing import verify_slice, write_embedding_table, write_slice
from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.core.errors import ArtifactError, ProvenanceMismatch, SplitSetInvalid
from meshnet.core.layers import LayerRange

SPEC = SyntheticSpec(n_layers=4)
RANGES = (LayerRange(0, 1), LayerRange(1, 3), LayerRange(3, 4), LayerRange(0, 4))


@pytest.fixture
def unsplit(synthetic_model_factory: Any) -> Path:
    return synthetic_model_factory(SPEC)


@pytest.fixture
def parts(unsplit: Path, tmp_path: Path) -> list[Path]:
    written = write_split_set(unsplit, tmp_path / "set", max_tensors=10)
    assert len(written) == 4  # 38 tensors: a set of several parts, each holding part of a block
    return written


def test_a_set_opens_as_the_unsplit_model(unsplit: Path, parts: list[Path]) -> None:
    whole, merged = parse_gguf(unsplit), open_model(parts[0])
    fields = lambda t: (t.name, t.shape, t.ggml_type, t.nbytes)  # noqa: E731
    assert [fields(t) for t in merged.tensors.values()] == [fields(t) for t in whole.tensors.values()]
    assert {t.part for t in merged.tensors.values()} == {0, 1, 2, 3}
    assert merged.metadata == whole.metadata  # the first part's, without split.*
    assert open_model(parts[0].parent) == merged  # the directory holding the set
    described = describe_model(parts[0])
    # Served under the set's name (the first part's stem without its part suffix), else the same.
    assert described.name == parts[0].name.removesuffix("-00001-of-00004.gguf")
    assert replace(described, path=unsplit, name=describe_model(unsplit).name) == describe_model(unsplit)
    assert describe_model(parts[0].parent).path == parts[0]
    assert memory_footprint(parts[0]) == memory_footprint(unsplit)
    assert decode_work(parts[0]) == decode_work(unsplit)


def test_a_later_part_is_refused_with_the_first_named(parts: list[Path]) -> None:
    with pytest.raises(SplitSetInvalid, match="give the first part") as caught:
        open_model(parts[2])
    assert caught.value.part == parts[2].name


def test_slices_of_a_set_are_the_slices_of_the_unsplit_file(unsplit: Path, parts: list[Path], tmp_path: Path) -> None:
    """Cut under one claimed identity, every role's slice and the head's table are the same bytes;
    each records the identity it was cut from, so by default the two differ in provenance only."""
    claimed = file_sha256(unsplit)
    for layers in RANGES:
        from_file, from_set = tmp_path / f"file-{layers}.gguf", tmp_path / f"set-{layers}.gguf"
        write_slice(unsplit, layers, from_file, source_sha256=claimed)
        write_slice(parts[0], layers, from_set, source_sha256=claimed)
        assert from_set.read_bytes() == from_file.read_bytes(), str(layers)
    write_embedding_table(unsplit, tmp_path / "file-table.gguf", source_sha256=claimed)
    write_embedding_table(parts[0].parent, tmp_path / "set-table.gguf", source_sha256=claimed)
    assert (tmp_path / "set-table.gguf").read_bytes() == (tmp_path / "file-table.gguf").read_bytes()
    own = write_slice(parts[0], LayerRange(1, 3), tmp_path / "own.gguf")
    assert own.source_sha256 == model_sha256(open_model(parts[0]))
    with pytest.raises(ProvenanceMismatch, match="cut from source"):
        verify_slice(tmp_path / "own.gguf", source_sha256=claimed)  # a set's slice never joins the file's route


def test_the_identity_covers_every_part_in_order(unsplit: Path, parts: list[Path], tmp_path: Path) -> None:
    identity = model_sha256(open_model(parts[0]))
    assert identity == model_sha256(open_model(parts[0].parent))  # stable
    assert identity not in {file_sha256(p) for p in parts} | {file_sha256(unsplit)}
    other = write_split_set(unsplit, tmp_path / "coarser", max_tensors=20)
    assert model_sha256(open_model(other[0])) != identity  # the same tensors cut differently: another source
    assert SliceCache(tmp_path / "cache").source_sha256(parts[0]) == identity


def _refused(first: Path, part: str, match: str) -> None:
    with pytest.raises(SplitSetInvalid, match=match) as caught:
        open_model(first)
    assert caught.value.part == part
    with pytest.raises(SplitSetInvalid):
        write_slice(first, LayerRange(0, 1), first.with_name("never.gguf"))
    assert not first.with_name("never.gguf").exists()


def test_a_missing_part_is_refused_by_name(parts: list[Path]) -> None:
    parts[2].unlink()
    _refused(parts[0], parts[2].name, "part 3 of 4 .* is missing")


def test_a_truncated_part_is_refused_by_name(parts: list[Path]) -> None:
    data = parts[3].read_bytes()
    parts[3].write_bytes(data[: len(data) - 100])
    _refused(parts[0], parts[3].name, "is damaged")


def test_reordered_parts_are_refused_by_name(parts: list[Path], tmp_path: Path) -> None:
    swap = tmp_path / "swap"
    parts[1].rename(swap)
    parts[2].rename(parts[1])
    swap.rename(parts[2])
    _refused(parts[0], parts[1].name, "says it is part 3 of 4, not part 2 of 4")


def test_a_foreign_part_is_refused_by_name(parts: list[Path], synthetic_model_factory: Any, tmp_path: Path) -> None:
    """Another model's part in the same position of a set of as many parts. (A part of a model of
    the very same shape and tensor names differs in bytes only: the identity shows that.)"""
    other = synthetic_model_factory(replace(SPEC, n_layers=5, seed=7))
    foreign = write_split_set(other, tmp_path / "other", max_tensors=12)
    assert len(foreign) == len(parts)
    shutil.copyfile(foreign[1], parts[1])
    _refused(parts[0], parts[1].name, "from another set")


def test_a_directory_without_one_set_is_refused(parts: list[Path], unsplit: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactError, match="first parts found: none"):
        open_model(tmp_path / "empty")
    write_split_set(unsplit, parts[0].parent, max_tensors=20, stem="again")
    with pytest.raises(ArtifactError, match="must hold one gguf-split set"):
        open_model(parts[0].parent)


def test_a_published_set_assembles_the_slices_cut_from_it(parts: list[Path], tmp_path: Path) -> None:
    published = publish_model(parts[0].parent, tmp_path / "pub")
    manifest = published.manifest
    identity = model_sha256(open_model(parts[0]))
    assert manifest.source.sha256 == identity and manifest.source.file_name == parts[0].name
    assert len(manifest.of_kind("layer")) == SPEC.n_layers
    total = sum(entry.size for entry in manifest.artifacts)
    for layers in RANGES:
        files = assemble_published(manifest, published.directory, layers, SliceCache(tmp_path / "c"), tmp_path / "w")
        reference = tmp_path / f"reference-{layers.start}-{layers.stop}.gguf"
        write_slice(parts[0], layers, reference)
        assert files.slice.read_bytes() == reference.read_bytes(), str(layers)
        assert verify_slice(files.slice, source_sha256=identity)[1].layers == layers
        if not layers.is_tail(SPEC.n_layers):
            assert sum(e.size for e in needed_artifacts(manifest, layers)) < total  # only its range
