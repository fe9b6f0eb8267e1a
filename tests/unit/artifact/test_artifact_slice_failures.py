"""Slicing refuses what it cannot do safely, leaves nothing half-written, and `meshnet slice`
reports every refusal with a non-zero exit and no output file."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from meshnet.artifact.gguf_file import parse_gguf
from meshnet.artifact.slicing import verify_slice, write_embedding_table, write_slice
from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.cli import main as cli
from meshnet.core.errors import ArtifactError, InvalidArgument, UnsupportedArchitecture
from meshnet.core.layers import LayerRange


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture
def source(tiny_model: Path, tmp_path: Path) -> Path:
    """A private copy of the 4-layer model in an otherwise empty folder."""
    return Path(shutil.copyfile(tiny_model, tmp_path / "model.gguf"))


@pytest.fixture
def foreign(synthetic_model_factory: Callable[[SyntheticSpec], Path], tmp_path: Path) -> Path:
    path = synthetic_model_factory(SyntheticSpec(architecture="phi3"))
    return Path(shutil.copyfile(path, tmp_path / "phi3.gguf"))


@pytest.mark.parametrize("layers", [LayerRange(2, 5), LayerRange(4, 5), LayerRange(0, 9)])
def test_out_of_bounds_range_is_invalid_and_writes_nothing(source: Path, layers: LayerRange) -> None:
    with pytest.raises(InvalidArgument, match=rf"layer range {layers} is out of bounds: the model has 4 layers"):
        write_slice(source, layers, source.with_name("out.gguf"))
    assert _leftovers(source.parent) == ["model.gguf"]


@pytest.mark.parametrize(("start", "stop"), [(2, 2), (3, 1), (-1, 2)])
def test_empty_or_negative_range_is_invalid(start: int, stop: int) -> None:
    with pytest.raises(InvalidArgument, match="empty or negative"):
        LayerRange(start, stop)


def test_unknown_architecture_is_refused_by_name(foreign: Path) -> None:
    assert parse_gguf(foreign).architecture == "phi3"
    with pytest.raises(UnsupportedArchitecture, match="'phi3' has no certified meshnet adapter") as raised:
        write_slice(foreign, LayerRange(0, 2), foreign.with_name("out.gguf"))
    assert type(raised.value) is UnsupportedArchitecture
    with pytest.raises(UnsupportedArchitecture, match="phi3"):
        write_embedding_table(foreign, foreign.with_name("emb.gguf"))
    assert _leftovers(foreign.parent) == ["phi3.gguf"]


def test_slicing_a_slice_is_refused(source: Path) -> None:
    first = source.with_name("head.gguf")
    write_slice(source, LayerRange(0, 3), first)
    with pytest.raises(ArtifactError, match="already a meshnet slice; slice the source model instead"):
        write_slice(first, LayerRange(0, 2), source.with_name("again.gguf"))
    full = source.with_name("full.gguf")
    write_slice(source, LayerRange(0, 4), full)
    with pytest.raises(ArtifactError, match="already a meshnet slice"):
        write_slice(full, LayerRange(0, 4), source.with_name("again.gguf"))
    with pytest.raises(ArtifactError, match="already a meshnet slice"):
        write_embedding_table(full, source.with_name("emb.gguf"))
    assert _leftovers(source.parent) == ["full.gguf", "head.gguf", "model.gguf"]


def test_a_corrupt_source_is_an_artifact_error(source: Path) -> None:
    source.write_bytes(source.read_bytes()[:1000])
    with pytest.raises(ArtifactError, match="truncated"):
        write_slice(source, LayerRange(0, 2), source.with_name("out.gguf"))
    assert _leftovers(source.parent) == ["model.gguf"]


def test_failure_while_writing_leaves_no_partial_and_keeps_the_old_file(
    source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = source.with_name("out.gguf")
    good = write_slice(source, LayerRange(1, 3), out)
    before = out.read_bytes()
    calls = []

    def fail_midway(self: GGUFWriter, tensor: np.ndarray) -> None:
        calls.append(1)
        if len(calls) % 3 == 0:
            raise OSError(28, "No space left on device")
        original(self, tensor)

    original = GGUFWriter.write_tensor_data
    monkeypatch.setattr(GGUFWriter, "write_tensor_data", fail_midway)
    with pytest.raises(OSError, match="No space left"):
        write_slice(source, LayerRange(1, 3), out)
    with pytest.raises(OSError, match="No space left"):
        write_slice(source, LayerRange(0, 2), source.with_name("head.gguf"))
    assert len(calls) == 6  # each attempt really failed mid-write
    assert _leftovers(source.parent) == ["model.gguf", "out.gguf"]
    assert out.read_bytes() == before
    assert verify_slice(out)[1] == good


# -- the command line -------------------------------------------------------------------------


def _slice_cli(source: Path, layers: str, out: Path) -> int:
    return cli.main(
        ["--data-dir", str(source.parent / "data"), "slice", str(source), "--layers", layers, "-o", str(out)]
    )


def test_cli_slices_a_head_with_its_embedding_table(source: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = source.with_name("head.gguf")
    assert _slice_cli(source, "0:2", out) == 0
    _, provenance = verify_slice(out, layers=LayerRange(0, 2), role="head")
    _, table = verify_slice(source.with_name("head.embeddings.gguf"), role="embedding")
    assert table.source_sha256 == provenance.source_sha256
    printed = capsys.readouterr().out
    assert "head slice of layers 0:2" in printed and "quantized token table" in printed
    assert _leftovers(source.parent) == ["head.embeddings.gguf", "head.gguf", "model.gguf"]


def test_cli_slices_a_tail_without_an_embedding_table(source: Path) -> None:
    out = source.with_name("tail.gguf")
    assert _slice_cli(source, "2:4", out) == 0
    verify_slice(out, layers=LayerRange(2, 4), role="tail")
    assert _leftovers(source.parent) == ["model.gguf", "tail.gguf"]


@pytest.mark.parametrize(
    ("layers", "message"),
    [
        ("3:3", "empty or negative"),
        ("2:9", "out of bounds"),
        ("4:5", "out of bounds"),
        ("a:b", "two integers"),
        ("1-3", "must look like A:B"),
    ],
)
def test_cli_refuses_bad_ranges_with_exit_2_and_no_file(
    source: Path, capsys: pytest.CaptureFixture[str], layers: str, message: str
) -> None:
    assert _slice_cli(source, layers, source.with_name("out.gguf")) == 2
    error = capsys.readouterr().err
    assert "meshnet slice: error [invalid_argument]" in error and message in error
    assert _leftovers(source.parent) == ["model.gguf"]


def test_cli_refuses_an_unknown_architecture(foreign: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _slice_cli(foreign, "0:2", foreign.with_name("out.gguf")) == 2
    assert "[unsupported_architecture]" in capsys.readouterr().err
    assert _leftovers(foreign.parent) == ["phi3.gguf"]


def test_cli_refuses_a_slice_as_source(source: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = source.with_name("mid.gguf")
    write_slice(source, LayerRange(1, 3), first)
    assert _slice_cli(first, "0:1", source.with_name("out.gguf")) == 2
    assert "already a meshnet slice" in capsys.readouterr().err
    assert _leftovers(source.parent) == ["mid.gguf", "model.gguf"]
