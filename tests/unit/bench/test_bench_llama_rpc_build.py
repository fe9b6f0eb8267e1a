"""The llama-rpc-3 lane's build: native, so cached per CPU and given the flags of every llama.cpp
build here (no AMX kernels on x86-64).

A real build of llama.cpp takes 20-40 minutes on 2 cores, so ``cmake`` here is a recording script
on PATH: what is under test is the command the lane hands it and where it looks for the result;
the fingerprint and flags come from the checkout's real scripts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from meshnet.bench.config import BenchConfig
from meshnet.bench.llama_rpc import SCRIPTS, TARGETS, LaneSkipped, ensure_binaries, native_target

# Records its arguments, one call a line; `--build DIR` makes the binaries the lane asks for.
FAKE_CMAKE = """#!/bin/sh
printf '%s\\n' "$*" >> "$CMAKE_CALLS"
if [ "$1" = "--build" ]; then mkdir -p "$2/bin" && touch "$2/bin/ggml-rpc-server" "$2/bin/llama-bench"; fi
"""


@pytest.fixture
def recording_cmake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "cmake").write_text(FAKE_CMAKE)
    (tools / "cmake").chmod(0o755)
    calls = tmp_path / "cmake-calls"
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CMAKE_CALLS", str(calls))
    return calls


def _config(tmp_path: Path) -> BenchConfig:
    source = tmp_path / "llama.cpp"
    source.mkdir(exist_ok=True)
    return BenchConfig(model=tmp_path / "m.gguf", data_dir=tmp_path / "data", build_llama_rpc=True, llama_source=source)


def _expected_target() -> tuple[str, str]:
    cpu = subprocess.run(["sh", str(SCRIPTS / "cpu_target.sh")], capture_output=True, text=True, check=True)
    flags = subprocess.run(["sh", str(SCRIPTS / "llama_cflags.sh")], capture_output=True, text=True, check=True)
    return cpu.stdout.strip(), flags.stdout.strip()


def test_the_build_is_cached_under_this_cpus_fingerprint_with_the_shared_flags(
    tmp_path: Path, recording_cmake: Path
) -> None:
    cpu, flags = _expected_target()
    assert native_target(SCRIPTS) == (cpu, flags)
    server, bench = ensure_binaries(_config(tmp_path), lambda _: None)
    build = tmp_path / "data" / "llama-rpc" / f"build-{cpu}"
    assert (server, bench) == tuple(build / "bin" / name for name in TARGETS)
    configure, build_call = recording_cmake.read_text().splitlines()
    assert f"-B {build} " in configure and "-DGGML_NATIVE=ON" in configure
    assert f"-DCMAKE_C_FLAGS={flags}" in configure and f"-DCMAKE_CXX_FLAGS={flags}" in configure
    assert build_call.startswith(f"--build {build} ")
    # Built once: a second call finds the binaries and runs no cmake.
    assert ensure_binaries(_config(tmp_path), lambda _: None) == (server, bench)
    assert len(recording_cmake.read_text().splitlines()) == 2


def test_a_build_for_another_cpu_is_not_used(tmp_path: Path, recording_cmake: Path) -> None:
    # A data dir carried from another machine: its build's kernels could be ones this CPU lacks.
    foreign = tmp_path / "data" / "llama-rpc" / "build-0123456789abcdef" / "bin"
    foreign.mkdir(parents=True)
    for name in TARGETS:
        (foreign / name).touch()
    server, _ = ensure_binaries(_config(tmp_path), lambda _: None)
    assert foreign not in server.parents
    assert len(recording_cmake.read_text().splitlines()) == 2


def test_without_the_build_step_an_uncached_lane_is_skipped_with_where_it_looked(tmp_path: Path) -> None:
    config = BenchConfig(model=tmp_path / "m.gguf", data_dir=tmp_path / "data")
    with pytest.raises(LaneSkipped, match=f"build-{_expected_target()[0]}/bin"):
        ensure_binaries(config, lambda _: None)


def test_outside_a_checkout_the_lane_is_skipped_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(LaneSkipped, match="source checkout"):
        ensure_binaries(_config(tmp_path), lambda _: None, scripts=tmp_path / "no-scripts")
