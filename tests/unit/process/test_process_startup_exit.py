"""A child that dies before its ready line: the error names how it ended, a signal by its name and
what it usually means (a crash in llama.cpp's kernels is SIGILL, not "code -4")."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from meshnet.process.launcher import ChildProcess, LaunchSpec, StartupFailed, exit_words


def _start_and_fail(tmp_path: Path, code: str) -> str:
    child = ChildProcess(LaunchSpec("doomed", (sys.executable, "-c", code), tmp_path / "doomed.log", "never "))
    try:
        with pytest.raises(StartupFailed) as failure:
            child.await_ready(time.monotonic() + 30)
    finally:
        child.stop(1.0)
    return str(failure.value)


def test_a_child_killed_by_sigill_says_so_with_what_it_means(tmp_path: Path) -> None:
    message = _start_and_fail(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    assert "doomed exited during start-up (killed by SIGILL: an instruction this CPU refused" in message


def test_a_child_that_exits_gives_its_code(tmp_path: Path) -> None:
    message = _start_and_fail(tmp_path, "import sys; sys.stderr.write('no model here\\n'); sys.exit(3)")
    assert "exited during start-up (code 3)" in message
    assert "no model here" in message  # the log's tail is quoted


def test_exit_words_name_signals_with_and_without_hints() -> None:
    assert exit_words(0) == "code 0"
    assert exit_words(None) == "code None"
    assert exit_words(-signal.SIGKILL).startswith("killed by SIGKILL: killed from outside")
    assert exit_words(-signal.SIGTERM) == "killed by SIGTERM"
    assert exit_words(-200) == "killed by signal 200"
