"""Which lab tags are in use on this machine: one advisory lock file per tag.

A lab's namespaces, links and cgroups carry fixed names derived from its tag, and building a lab
first removes whatever carries its names (what a SIGKILLed run left). Without a claim, a second
``lab up`` (or a second test run) with the same tag would kill the first one's processes and
tear down its network mid-request. The claim is an ``flock`` on ``<directory>/<tag>.lock``:
the kernel drops it when the holder exits however it exits, so leftovers of a dead lab are
never protected, and a live lab's always are.

Building also takes a short machine-wide lock (``.build.lock``: no tag can name it) so that two
labs starting at the same moment do not both pick the same free subnet.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from meshnet.core.errors import MeshnetError
from meshnet.deploy.lab.plan import check_tag, is_tag

CLAIMS_DIR = Path("/run/meshnet-lab")
"""Machine-wide (tmpfs, emptied at boot); the lab needs root, which may write here."""
BUILD_LOCK_TIMEOUT_S = 60.0
"""Long enough for another lab to make its bridge and namespaces; never an unbounded wait."""


class LabInUse(MeshnetError):
    """Another live process holds this lab tag (or the build lock past the timeout)."""

    code = "lab_in_use"


@dataclass
class LabClaim:
    """A held claim on one tag; ``release`` (or the holder's exit) gives it up."""

    tag: str
    _fd: int | None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None


def _holder(path: Path) -> str:
    """The pid the holder wrote, for the error message (best effort: it may be mid-write)."""
    with contextlib.suppress(OSError, ValueError):
        return f"pid {int(path.read_text().strip())}"
    return "another process"


def claim(tag: str, directory: Path = CLAIMS_DIR) -> LabClaim:
    """Claim ``tag`` for this process or raise ``LabInUse`` naming the holder; never waits."""
    check_tag(tag)  # before it becomes a file name
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{tag}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LabInUse(f"lab tag {tag!r} is in use by {_holder(path)}; stop that lab or choose another --tag") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return LabClaim(tag, fd)


def in_use(tag: str, directory: Path = CLAIMS_DIR) -> bool:
    """Does a live process hold ``tag``? (Probes the lock and lets go of it at once.)"""
    try:
        probe = claim(tag, directory)
    except LabInUse:
        return True
    probe.release()
    return False


def claim_free(tags: Iterable[str], directory: Path = CLAIMS_DIR) -> tuple[list[LabClaim], frozenset[str]]:
    """Claim every tag of ``tags`` no live lab holds: (the claims, the tags refused as in use).

    Cleanup holds these while it removes, so a lab starting meanwhile cannot lose its objects."""
    held: list[LabClaim] = []
    refused: set[str] = set()
    for tag in sorted(set(tags)):
        try:
            held.append(claim(tag, directory))
        except LabInUse:
            refused.add(tag)
    return held, frozenset(refused)


def claimed_tags(directory: Path = CLAIMS_DIR) -> frozenset[str]:
    """Every tag a live process holds now."""
    if not directory.is_dir():
        return frozenset()
    names = {path.stem for path in directory.glob("*.lock")}
    return frozenset(tag for tag in names if is_tag(tag) and in_use(tag, directory))


@contextlib.contextmanager
def building(directory: Path = CLAIMS_DIR, timeout_s: float = BUILD_LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the machine-wide build lock while a lab picks its subnet and makes its network."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / ".build.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LabInUse(f"another lab has been building for over {timeout_s:.0f} s") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)
