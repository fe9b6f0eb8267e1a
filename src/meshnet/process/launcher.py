"""Start a child, wait for its ready line, stop it with grace: the one process launcher.

A child is a command (usually ``python -m meshnet ...``) that prints one ready line on
stdout once it serves (``PREFIX ADDRESS KEY=VALUE ...``; each component's own line is defined in
``deploy.launch.ready_lines``, this module reads any). Its stderr goes to
a log file, quoted when start-up fails. It runs in its own process group (a Ctrl-C in the
terminal reaches only the supervisor, which stops children in order) and holds a lifeline, so
it dies with the supervisor however that dies.

Spawning never runs Python between fork and exec (no ``preexec_fn``): CPython then spawns with
vfork+exec, which is safe in a process that runs gRPC threads; a real fork() there is not.
Stopping is SIGTERM, a bounded wait, then SIGKILL to the child's whole process group.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from meshnet.core.errors import MeshnetError
from meshnet.process.lifeline import Lifeline

STOP_GRACE_S = 5.0
KILL_WAIT_S = 5.0
"""After SIGKILL the kernel ends the process at once; this only bounds reaping it."""
LOG_TAIL_LINES = 30


SIGNAL_HINTS = {
    signal.SIGILL: "an instruction this CPU refused: a library built for features the machine does not allow",
    signal.SIGKILL: "killed from outside: the kernel's out-of-memory killer, or a memory limit",
    signal.SIGSEGV: "a crash in native code",
}
"""What a signal that ends a child at start-up usually means, for its error."""


def exit_words(code: int | None) -> str:
    """A child's exit for its error: its code, or the signal that ended it and what that means
    (a crash in llama.cpp reads "killed by SIGILL (...)", not "code -4")."""
    if code is None or code >= 0:
        return f"code {code}"
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return f"killed by signal {-code}"
    hint = SIGNAL_HINTS.get(sig)
    return f"killed by {sig.name}" + (f": {hint}" if hint else "")


class StartupFailed(MeshnetError):
    """A child exited, or never printed its ready line, before it served."""

    code: ClassVar[str] = "startup_failed"

    def __init__(self, message: str, *, name: str, log_path: Path, log_tail: str) -> None:
        super().__init__(f"{message}; see {log_path}" + (f"\n{log_tail}" if log_tail else ""))
        self.name = name
        self.log_path = log_path
        self.log_tail = log_tail


@dataclass(frozen=True)
class LaunchSpec:
    name: str
    command: tuple[str, ...]
    log_path: Path
    ready_prefix: str
    """The child is ready once a stdout line starts with this."""
    environment: Mapping[str, str] = field(default_factory=dict)
    """Added to (and overriding) this process's environment."""


@dataclass(frozen=True)
class ReadyLine:
    """The ready line a child printed: ``PREFIX WORD ... KEY=VALUE ...``."""

    text: str
    prefix: str

    @property
    def words(self) -> tuple[str, ...]:
        return tuple(self.text[len(self.prefix) :].split())

    @property
    def first(self) -> str:
        """The first word after the prefix: by convention the bound address."""
        return self.words[0] if self.words else ""

    @property
    def values(self) -> dict[str, str]:
        return dict(word.split("=", 1) for word in self.words if "=" in word)

    def value_to_end(self, key: str) -> str:
        """The value of ``key=`` read to the end of the line: a last field that may hold spaces
        (a model's name from its GGUF: ``model=Smollm2 135M 8k ...``)."""
        marker = f" {key}="
        return self.text.split(marker, 1)[1] if marker in self.text else ""


def meshnet_command(data_dir: Path, *args: str) -> tuple[str, ...]:
    """The command line of a ``meshnet`` subcommand run by this interpreter on ``data_dir``."""
    return (sys.executable, "-m", "meshnet", "--data-dir", str(data_dir), *args)


def child_environment(extra: Mapping[str, str]) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **extra}


class ChildProcess:
    """One started child: its process, lifeline, stdout pump and log."""

    def __init__(self, spec: LaunchSpec, *, append_log: bool = False) -> None:
        self.spec = spec
        self.ready: ReadyLine | None = None
        self._lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._lifeline = Lifeline()
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with spec.log_path.open("a" if append_log else "w") as log:
                self.process = subprocess.Popen(
                    list(spec.command),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    env=child_environment({**spec.environment, **self._lifeline.child_environment()}),
                    pass_fds=(self._lifeline.read_fd,),
                    # Its own process group, not its own session: a Ctrl-C in the terminal
                    # reaches only the supervisor, and the child stays in the supervisor's
                    # scheduling autogroup (so `nice` on the supervisor still covers it).
                    process_group=0,
                )
        except BaseException:
            self._lifeline.cut()
            raise
        finally:
            self._lifeline.handed_over()
        threading.Thread(target=self._pump, name=f"stdout {spec.name}", daemon=True).start()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def await_ready(self, deadline: float) -> ReadyLine:
        """Block until the ready line (by ``deadline``, a ``time.monotonic()`` value)."""
        prefix = self.spec.ready_prefix
        while self.ready is None:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise self._failure("did not print its ready line in time") from None
            if line is None:
                raise self._failure(f"exited during start-up ({exit_words(self._exit_code())})")
            if line.startswith(prefix):
                self.ready = ReadyLine(line, prefix)
        return self.ready

    def send_signal(self, sig: int) -> None:
        """Signal the child itself (not its group), if it still runs."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    def signal_group(self, sig: int) -> None:
        """Signal the child's whole process group: whatever it started goes too."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    def wait_exit(self, timeout_s: float) -> int | None:
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM, up to ``grace_s`` to exit, then SIGKILL to the group; returns the exit code."""
        if self.alive:
            self.send_signal(signal.SIGTERM)
            self.wait_exit(grace_s)
        # Whatever is left of the group (the child, or a process it started) goes now.
        self.signal_group(signal.SIGKILL)
        code = self.wait_exit(KILL_WAIT_S)
        self._lifeline.cut()
        if self.process.stdout is not None:
            with contextlib.suppress(OSError):
                self.process.stdout.close()
        return code

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.spec.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def _exit_code(self) -> int | None:
        return self.wait_exit(1.0)

    def _failure(self, what: str) -> StartupFailed:
        return StartupFailed(
            f"{self.name} {what}", name=self.name, log_path=self.spec.log_path, log_tail=self.log_tail()
        )

    def _pump(self) -> None:
        # Drains stdout for the child's whole life so a chatty child never blocks on a full pipe.
        stdout = self.process.stdout
        if stdout is not None:
            with contextlib.suppress(ValueError, OSError):
                for line in stdout:
                    if self.ready is None:
                        self._lines.put(line.rstrip("\n"))
        self._lines.put(None)


def stop_all(children: Sequence[ChildProcess], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every child at once (their graces overlap), then stop each in turn."""
    for child in children:
        child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        child.stop(max(deadline - time.monotonic(), 0.0))


def launch_all(specs: Sequence[LaunchSpec], timeout_s: float) -> list[ChildProcess]:
    """Start every spec at once, wait until all are ready (in order), or stop them all and raise."""
    children: list[ChildProcess] = []
    try:
        for spec in specs:
            children.append(ChildProcess(spec))
        deadline = time.monotonic() + timeout_s
        for child in children:
            child.await_ready(deadline)
    except BaseException:
        stop_all(children)
        raise
    return children
