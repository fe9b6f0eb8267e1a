"""A child's life tied to its supervisor's: a pipe whose write end only the supervisor holds.

The kernel closes every descriptor of a process that dies, whatever killed it (SIGKILL
included), so the child reads end-of-file on the pipe's read end at the moment its supervisor
is gone, and then ends itself: SIGTERM first, so its own shutdown path runs (records are
flushed, ports released), then a hard exit after a short grace.

Why not ``prctl(PR_SET_PDEATHSIG)``: set before ``exec`` it needs ``preexec_fn``, which forces
a real ``fork()`` that runs Python in a process with gRPC threads (the CI crash: a child
aborting with ``epoll_wait error: Bad file descriptor``); set by the child after ``exec`` it
fires when the *thread* that spawned the child ends, not the process, so a supervisor that
starts a child from a helper thread would kill it when that thread returns. The pipe needs
neither: the read end is handed over with ``pass_fds`` and the spawn stays a plain vfork+exec.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import MutableMapping

from meshnet.core.errors import InvalidArgument

LIFELINE_ENV = "MESHNET_LIFELINE_FD"
"""Names the inherited descriptor (like systemd's ``LISTEN_FDS``): the child's read end."""
EXIT_GRACE_S = 1.5
"""How long the child's own SIGTERM shutdown may take once its supervisor is gone; then it
exits hard, so every child is gone within 2 s of its supervisor."""
ORPHAN_EXIT_CODE = 70


class Lifeline:
    """The supervisor's side of one child's lifeline: a pipe, read end for the child."""

    def __init__(self) -> None:
        # os.pipe() descriptors are not inheritable: only the read end, passed explicitly with
        # pass_fds, reaches the child, and no other child ever holds this write end.
        self.read_fd, self._write_fd = os.pipe()

    def child_environment(self) -> dict[str, str]:
        return {LIFELINE_ENV: str(self.read_fd)}

    def handed_over(self) -> None:
        """The child holds its copy of the read end now; ours would only keep the pipe open."""
        with contextlib.suppress(OSError):
            os.close(self.read_fd)

    def cut(self) -> None:
        """Close the write end: the child sees end-of-file and stops (idempotent)."""
        if self._write_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._write_fd)
            self._write_fd = -1


def watch_lifeline(environ: MutableMapping[str, str], grace_s: float = EXIT_GRACE_S) -> bool:
    """In a child: if ``environ`` names a lifeline, end this process when the supervisor dies.

    Removes the variable from ``environ`` so a process this one starts never mistakes some
    unrelated descriptor of its own for a lifeline. Returns whether a lifeline is watched.
    """
    value = environ.pop(LIFELINE_ENV, None)
    if value is None:
        return False
    try:
        fd = int(value)
        os.fstat(fd)
    except (ValueError, OSError) as error:
        raise InvalidArgument(f"{LIFELINE_ENV}={value!r} names no open descriptor: {error}") from None
    os.set_inheritable(fd, False)
    threading.Thread(target=_watch, args=(fd, grace_s), name="lifeline", daemon=True).start()
    return True


def _watch(fd: int, grace_s: float) -> None:
    with contextlib.suppress(OSError):
        while os.read(fd, 512):
            pass  # the supervisor never writes; anything read is ignored
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    os._exit(ORPHAN_EXIT_CODE)
