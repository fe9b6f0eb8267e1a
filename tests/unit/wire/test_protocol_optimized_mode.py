"""W12: validation must not depend on ``assert``: the malformed-frame property test passes the
same under ``python -O``, which strips asserts. (That test checks with ``pytest.fail`` and
``pytest.raises``, not bare asserts, so it still tests something under -O.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_malformed_frames_are_refused_the_same_under_python_dash_o() -> None:
    env = dict(os.environ)
    result = subprocess.run(
        [
            sys.executable,
            "-O",
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/unit/wire/test_protocol_malformed.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
