"""Builds and runs every upstream repro (docs/upstream/repro/*.c) against the pinned wheel.

Each repro demonstrates one llama.cpp behaviour the split engine relies on (docs/upstream/README.md)
and prints PASS or FAIL. They are compiled with the system C compiler against the headers and the
libllama/libggml shipped in the installed llama-cpp-python wheel, so a pin change that breaks an
assumption fails here, by name, as well as in the start-up certification. Binaries are cached under
the temp dir, keyed by the sources, the wheel version and its library path.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import llama_cpp
import pytest
from upstream_moe_model import write_moe_model

from meshnet.artifact.slicing import write_slice
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.core.layers import LayerRange

REPRO_DIR = Path(__file__).resolve().parents[2] / "docs" / "upstream" / "repro"
N_LAYERS = SyntheticSpec().n_layers


def _lib_dir() -> Path:
    return Path(llama_cpp.__file__).parent / "lib"


def _include_dir() -> Path:
    """The headers the wheel installs next to its libraries (the pinned llama.h and ggml headers)."""
    for file in importlib.metadata.files("llama-cpp-python") or ():
        if file.name == "llama.h":
            return Path(str(file.locate())).parent
    pytest.fail("the llama-cpp-python wheel ships no llama.h: cannot build the upstream repros")


def _compiler() -> str:
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        pytest.fail("no C compiler (cc): the upstream repros need one to build against the wheel")
    return compiler


@pytest.fixture(scope="module")
def build() -> Callable[[str], Path]:
    """``build(name) -> binary``, compiling docs/upstream/repro/<name>.c once per source and wheel."""
    compiler = _compiler()
    include, lib = _include_dir(), _lib_dir()
    folder = Path(tempfile.gettempdir()) / f"meshnet-upstream-repro-{os.getuid()}"
    folder.mkdir(parents=True, exist_ok=True)
    header = (REPRO_DIR / "repro.h").read_bytes()

    def compile_repro(name: str) -> Path:
        source = REPRO_DIR / f"{name}.c"
        key = hashlib.sha256(
            header + source.read_bytes() + f"{llama_cpp.__version__}|{lib}|{compiler}".encode()
        ).hexdigest()[:16]
        binary = folder / f"{name}-{key}"
        if not binary.exists():
            partial = folder / f"{binary.name}.{os.getpid()}.partial"
            command = [compiler, "-std=c11", "-O1", "-Wall", f"-I{include}", str(source), "-o", str(partial)]
            command += [f"-L{lib}", "-lllama", "-lggml", "-lggml-base", "-lm", f"-Wl,-rpath,{lib}"]
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                pytest.fail(f"{name}.c does not build against the pinned wheel:\n{result.stderr}")
            os.replace(partial, binary)
        return binary

    return compile_repro


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The synthetic source, its head/middle/tail range slices and a tiny MoE slice."""
    folder = tmp_path_factory.mktemp("upstream-repro-models")
    source = write_synthetic_model(folder / "tiny.gguf")
    paths = {"source": source}
    for role, layers in (("head", LayerRange(0, 2)), ("middle", LayerRange(1, 3)), ("tail", LayerRange(2, N_LAYERS))):
        paths[role] = folder / f"{role}.gguf"
        write_slice(source, layers, paths[role])
    paths["moe"] = write_moe_model(folder / "moe.gguf")
    return paths


REPROS: dict[str, Callable[[dict[str, Path]], list[str]]] = {
    "01_vocabless_slice": lambda m: [str(m["source"]), str(m["middle"]), "2"],
    "02_embd_input_positions": lambda m: [str(m["source"])],
    "03_boundary_output_all_rows": lambda m: [str(m["source"]), str(m["head"]), str(m["tail"])],
    "04_stop_graph_after_capture": lambda m: [str(m["source"]), str(m["head"])],
    "05_kv_stream_per_session": lambda m: [str(m["source"])],
    "06_moe_intermediate_write": lambda m: [str(m["moe"])],
}


def test_every_repro_source_is_run() -> None:
    on_disk = {path.stem for path in REPRO_DIR.glob("*.c")}
    assert on_disk == set(REPROS), f"repros on disk {sorted(on_disk)} vs run here {sorted(REPROS)}"


@pytest.mark.parametrize("name", sorted(REPROS))
def test_upstream_repro(name: str, build: Callable[[str], Path], models: dict[str, Path]) -> None:
    binary = build(name)
    result = subprocess.run(
        [str(binary), *REPROS[name](models)], capture_output=True, text=True, timeout=120, check=False
    )
    lines = result.stdout.strip().splitlines()
    failed = [line for line in lines if line.startswith("CHECK") and ": FAILED" in line]
    assert result.returncode == 0 and lines and lines[-1] == "PASS" and not failed, (
        f"{name}: a llama.cpp behaviour meshnet relies on changed on this build "
        f"(see docs/upstream/README.md)\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr[-2000:]}"
    )
