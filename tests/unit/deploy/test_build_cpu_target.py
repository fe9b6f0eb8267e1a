"""scripts/cpu_target.sh names the CPU a native llama.cpp build is for: the same on one CPU, another
wherever -march=native would pick other instructions (a venv carried there is rebuilt, not killed
by SIGILL), and blind to what differs between VMs of one CPU (cache sizes)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "cpu_target.sh"

GCC_LINE = (
    ' "/usr/lib/gcc/x86_64-linux-gnu/12/cc1" "-E" "-quiet" "-" "-march=cooperlake" "-mmmx" "-mavx2" '
    '"{extra}" "-mno-xop" "--param" "l1-cache-size=48" "--param" "l2-cache-size={l2}" "-mtune=generic"'
)
CLANG_LINE = ' "/usr/bin/clang" "-cc1" "-target-cpu" "znver3" "-target-feature" "+avx2" "-target-feature" "{extra}"'


def _fake_compiler(tmp_path: Path, name: str, line: str) -> Path:
    """A compiler that answers `-###` with the cc1 line given, as gcc and clang print theirs (stderr)."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\necho 'Target: x86_64-linux-gnu' >&2\necho '{line}' >&2\n")
    path.chmod(0o755)
    return path


def _target(compiler: Path | str) -> str:
    env = {**os.environ, "CC": str(compiler)}
    return subprocess.run([str(SCRIPT)], env=env, capture_output=True, text=True, check=True).stdout.strip()


def test_one_cpu_one_name_whatever_its_cache_sizes(tmp_path: Path) -> None:
    small = _fake_compiler(tmp_path, "gcc-a", GCC_LINE.format(extra="-mavx512fp16", l2=1024))
    large = _fake_compiler(tmp_path, "gcc-b", GCC_LINE.format(extra="-mavx512fp16", l2=2048))
    assert re.fullmatch(r"[0-9a-f]{16}", _target(small))
    assert _target(small) == _target(large)


def test_a_cpu_without_one_instruction_set_gets_another_name(tmp_path: Path) -> None:
    with_fp16 = _fake_compiler(tmp_path, "gcc-a", GCC_LINE.format(extra="-mavx512fp16", l2=1024))
    without = _fake_compiler(tmp_path, "gcc-b", GCC_LINE.format(extra="-mno-avx512fp16", l2=1024))
    assert _target(with_fp16) != _target(without)


def test_clang_features_count_too(tmp_path: Path) -> None:
    with_512 = _fake_compiler(tmp_path, "clang-a", CLANG_LINE.format(extra="+avx512f"))
    without = _fake_compiler(tmp_path, "clang-b", CLANG_LINE.format(extra="+sse4.2"))
    assert _target(with_512) != _target(without)


def test_this_machines_compiler_gives_a_steady_name() -> None:
    first = _target(os.environ.get("CC", "cc"))
    assert re.fullmatch(r"[0-9a-f]{16}", first)
    assert _target(os.environ.get("CC", "cc")) == first
