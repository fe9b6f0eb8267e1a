"""A running lab's tag is claimed: another lab (or `lab down`) is refused, a dead holder frees it.

The holder is a real second process, as another `lab up` or test run would be; the kernel
releases its flock when it is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.deploy.lab import claims


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A separate process holding tag ``t1`` in ``tmp_path`` until killed."""
    script = (
        "import sys, time; from pathlib import Path; from meshnet.deploy.lab import claims; "
        "claims.claim('t1', Path(sys.argv[1])); print('held', flush=True); time.sleep(600)"
    )
    process = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    yield process
    process.kill()
    process.wait()


def test_a_held_tag_is_refused_naming_the_holder(tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    with pytest.raises(claims.LabInUse, match=f"in use by pid {holder.pid}"):
        claims.claim("t1", tmp_path)
    assert claims.in_use("t1", tmp_path)
    assert claims.claimed_tags(tmp_path) == frozenset({"t1"})
    # Other tags are free meanwhile.
    other = claims.claim("t2", tmp_path)
    assert claims.claimed_tags(tmp_path) == frozenset({"t1", "t2"})
    other.release()


def test_a_killed_holder_frees_its_tag(tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    claim = claims.claim("t1", tmp_path)  # its lock file is still there; the lock is not
    assert (tmp_path / "t1.lock").read_text().strip() == str(os.getpid())
    claim.release()
    assert not claims.in_use("t1", tmp_path) and claims.claimed_tags(tmp_path) == frozenset()


def test_one_process_cannot_claim_a_tag_twice_and_release_is_idempotent(tmp_path: Path) -> None:
    first = claims.claim("t3", tmp_path)
    with pytest.raises(claims.LabInUse):
        claims.claim("t3", tmp_path)
    first.release()
    first.release()
    claims.claim("t3", tmp_path).release()


def test_the_build_lock_waits_a_bounded_time(tmp_path: Path) -> None:
    held = claims.building(tmp_path)
    held.__enter__()
    try:
        with pytest.raises(claims.LabInUse, match="building"), claims.building(tmp_path, timeout_s=0.2):
            pass
        claims.claim("build", tmp_path).release()  # a lab may be called "build": another lock
    finally:
        held.__exit__(None, None, None)
    with claims.building(tmp_path, timeout_s=0.2):
        pass
    assert claims.claimed_tags(tmp_path) == frozenset()  # the build lock is not a tag


def test_claim_free_skips_live_labs_and_refuses_bad_tags(tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    held, refused = claims.claim_free(["t1", "t2", "t3", "t2"], tmp_path)
    assert [claim.tag for claim in held] == ["t2", "t3"] and refused == frozenset({"t1"})
    for claim in held:
        claim.release()
    with pytest.raises(InvalidArgument):
        claims.claim("../x", tmp_path)
    assert not (tmp_path.parent / "x.lock").exists()
