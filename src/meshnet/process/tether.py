"""``python -m meshnet.process.tether PROGRAM ARGS...``: a lifeline for a program that cannot hold one.

A meshnet child watches its own lifeline (``cli.main`` calls ``lifeline.watch_lifeline``); a
foreign program, such as the etcd members tests and benchmarks start (a Go binary), cannot. The
tether runs it as its child and watches the lifeline in its place: once the supervisor is gone
(or the tether gets SIGTERM/SIGINT) it passes SIGTERM on, and SIGKILL after ``KILL_AFTER_S``,
within the lifeline's own grace, so the program is gone before the tether exits. It exits with
the program's status.

A supervisor that means to crash the program (SIGKILL, no goodbye) sends ``CRASH_SIGNAL`` to the
tether, never SIGKILL to the group: the tether kills the program and reaps it before it exits.
Killed together, the program would outlive its parent as a zombie handed to PID 1, which in a
container often reaps nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from types import FrameType

from meshnet.process.lifeline import EXIT_GRACE_S, watch_lifeline

KILL_AFTER_S = EXIT_GRACE_S / 2
"""SIGTERM's grace for the program: well inside the lifeline's, after which the tether exits hard."""
USAGE_EXIT_CODE = 2
CRASH_SIGNAL = signal.SIGUSR1
"""Tells the tether to SIGKILL its program at once (then reap it and exit with its status)."""


class Tether:
    """The program's side of the tether: started once, stopped at most once."""

    def __init__(self) -> None:
        self.program: subprocess.Popen[bytes] | None = None
        self.stopping = False

    def stop(self, signum: int = signal.SIGTERM, frame: FrameType | None = None) -> None:
        """A signal handler (main thread): SIGTERM to the program now, SIGKILL if it lingers."""
        self.stopping = True
        program = self.program
        if program is None or program.poll() is not None:
            return
        program.send_signal(signal.SIGTERM)
        backstop = threading.Timer(KILL_AFTER_S, program.kill)
        backstop.daemon = True  # a program that exited in time must not hold the tether's exit
        backstop.start()

    def crash(self, signum: int = CRASH_SIGNAL, frame: FrameType | None = None) -> None:
        """A signal handler (main thread): SIGKILL to the program now; ``run`` still reaps it."""
        self.stopping = True
        if self.program is not None:
            self.program.kill()  # a no-op once the program has exited

    def run(self, command: list[str]) -> int:
        # Handlers first: the lifeline may be cut already, and its watcher then signals at once.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.stop)
        signal.signal(CRASH_SIGNAL, self.crash)
        watch_lifeline(os.environ)  # also takes its variable out of the program's environment
        if self.stopping:
            return 128 + signal.SIGTERM
        self.program = subprocess.Popen(command)
        if self.stopping:  # a signal between the check and the assignment found no program
            self.stop()
        code = self.program.wait()
        return 128 - code if code < 0 else code


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m meshnet.process.tether PROGRAM [ARGS...]", file=sys.stderr)
        return USAGE_EXIT_CODE
    return Tether().run(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
