"""`make install` puts a `meshnet` on PATH that a fresh shell runs, sharing `make run`'s data dir.

The launcher is written for a temporary HOME (``PREFIX``) against the venv running these tests,
then a shell with nothing inherited but that HOME and a bare PATH runs it. The data dir it passes
is the one `make run` serves from: the same Makefile variable, checked on both commands as make
prints them, and by a command through the launcher that writes there (`swarm init`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed"),
    pytest.mark.skipif(not (VENV_BIN / "meshnet").exists(), reason=f"no meshnet console script in {VENV_BIN}"),
]


def make(*arguments: str) -> str:
    done = subprocess.run(["make", "-C", str(REPO), *arguments], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def fresh_shell(home: Path, command: str) -> subprocess.CompletedProcess[str]:
    """``command`` in ``sh`` with no inherited environment: HOME, and PATH = ~/.local/bin + the system's."""
    environment = {"HOME": str(home), "PATH": f"{home}/.local/bin:/usr/bin:/bin"}
    return subprocess.run(["sh", "-c", command], env=environment, capture_output=True, text=True, timeout=60)


def test_make_install_puts_a_meshnet_on_path_that_a_fresh_shell_runs(tmp_path: Path) -> None:
    home, data = tmp_path / "home", tmp_path / "data"
    said = make("launcher", f"PREFIX={home}/.local", f"BIN={VENV_BIN}", f"DATA_DIR={data}", "MESHNET_BACKEND=")
    assert f"installed {home}/.local/bin/meshnet" in said
    helped = fresh_shell(home, "meshnet --help")
    assert helped.returncode == 0, helped.stderr
    assert "Serve one GGUF model across several machines." in helped.stdout
    # The next command writes where `make run` serves from...
    initialized = fresh_shell(home, "meshnet swarm init")
    assert initialized.returncode == 0, initialized.stderr
    assert (data / "swarm").is_dir(), initialized.stdout
    # ...unless told otherwise.
    elsewhere = tmp_path / "elsewhere"
    assert fresh_shell(home, f"meshnet --data-dir {elsewhere} swarm init").returncode == 0
    assert (elsewhere / "swarm").is_dir()


def test_make_run_and_the_launcher_name_one_data_dir_by_default() -> None:
    # Dry runs: nothing is built, provisioned or installed.
    (served,) = re.findall(r"meshnet --data-dir (\S+) up", make("-n", "run"))
    (launched,) = re.findall(r"install_launcher\.sh \S+ (\S+) ", make("-n", "launcher"))
    assert served == launched
    if "DATA_DIR" not in os.environ and "DATA_DIR" not in os.environ.get("MAKEFLAGS", ""):
        assert served == str(REPO / ".data")  # the default: the checkout's own .data
