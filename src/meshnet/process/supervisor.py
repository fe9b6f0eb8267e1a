"""Keep a set of children running: start them together, restart one that dies, stop them all.

A child that exits on its own is started again from its spec (the same command, data dir and
pinned ports), and its restart is counted and reported. A child that keeps dying (more than
``max_restarts`` within ``window_s``) is a crash loop: the supervisor gives up rather than
restart it forever. Children of one ``group`` (an expert-parallel group and its front: none
can continue without the others) are restarted together: when one dies, the others are stopped
and all are started again. Everything runs in the caller's thread; nothing here sleeps in the
background.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal, NoReturn

from meshnet.core.errors import MeshnetError
from meshnet.process.launcher import STOP_GRACE_S, ChildProcess, LaunchSpec, ReadyLine, StartupFailed, stop_all

Event = Literal["started", "exited", "restarted"]
Pin = Callable[[LaunchSpec, ReadyLine], LaunchSpec]
"""Given a spec and the ready line its child printed, the spec restarts use (say, with the port
the first start bound, so peers that know the address find the restarted child there)."""


class CrashLoop(MeshnetError):
    """A supervised child died again and again; restarting it more would not help."""

    code: ClassVar[str] = "crash_loop"


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 5
    """Restarts allowed within ``window_s`` before the supervisor gives up."""
    window_s: float = 60.0
    delay_s: float = 0.5
    """Pause before a restart, so a child that dies at once does not spin a core."""
    group_stop_grace_s: float = 5.0
    """How long the survivors of a group get to exit after SIGTERM before they are killed."""


@dataclass
class Supervised:
    """One supervised component: its spec, the running child, and how often it was restarted."""

    spec: LaunchSpec
    pin: Pin | None = None
    child: ChildProcess | None = None
    restarts: int = 0
    last_exit: int | None = None
    recent_restarts: deque[float] = field(default_factory=deque)
    """When each restart within the policy's window happened (``time.monotonic()``)."""
    group: str | None = None
    """Children sharing a group are restarted together (see the module docstring)."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def ready(self) -> ReadyLine:
        if self.child is None or self.child.ready is None:
            raise StartupFailed(f"{self.name} is not running", name=self.name, log_path=self.spec.log_path, log_tail="")
        return self.child.ready

    def launch(self) -> ChildProcess:
        # A restart appends to the log: the lines before the crash are the ones worth reading.
        self.child = ChildProcess(self.spec, append_log=self.restarts > 0)
        return self.child

    def became_ready(self) -> None:
        if self.pin is not None:
            self.spec = self.pin(self.spec, self.ready)


Listener = Callable[[Supervised, Event], None]


class Supervisor:
    def __init__(self, ready_timeout_s: float, policy: RestartPolicy, on_event: Listener) -> None:
        self.ready_timeout_s = ready_timeout_s
        self.policy = policy
        self.components: list[Supervised] = []
        self._on_event = on_event

    def start(self, components: Sequence[Supervised]) -> None:
        """Start ``components`` at once and wait until each is ready (in order).

        On any failure every child this supervisor runs is stopped before the error propagates.
        """
        self.components.extend(components)
        try:
            for component in components:
                component.launch()
            deadline = time.monotonic() + self.ready_timeout_s
            for component in components:
                self._await(component, deadline, "started")
        except BaseException:
            self.stop()
            raise

    def watch(self, poll_s: float = 0.25) -> NoReturn:
        """Restart whatever dies, until interrupted; raises ``CrashLoop`` if one keeps dying."""
        while True:
            self.restart_exited()
            time.sleep(poll_s)

    def restart_exited(self) -> None:
        """Restart every child that has exited (with its group); raises ``CrashLoop`` as ``watch``."""
        for component in self.components:
            if component.child is not None and not component.child.alive:
                self._restart(component)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every child, the last started first (the gateway before the tracker)."""
        stop_all([c.child for c in reversed(self.components) if c.child is not None], grace_s)

    def _restart(self, component: Supervised) -> None:
        child = component.child
        component.last_exit = child.returncode if child is not None else None
        self._on_event(component, "exited")
        members = self._members(component)
        while True:
            now = time.monotonic()
            while component.recent_restarts and now - component.recent_restarts[0] > self.policy.window_s:
                component.recent_restarts.popleft()
            if len(component.recent_restarts) >= self.policy.max_restarts:
                raise CrashLoop(
                    f"{component.name} exited {len(component.recent_restarts) + 1} times within "
                    f"{self.policy.window_s:.0f} s (last code {component.last_exit}); see {component.spec.log_path}"
                )
            component.recent_restarts.append(now)
            time.sleep(self.policy.delay_s)
            # Reaps the exited child and closes its lifeline; stops a group's survivors.
            stop_all([m.child for m in members if m.child is not None], self.policy.group_stop_grace_s)
            for member in members:
                member.restarts += 1
                member.launch()
            try:
                deadline = time.monotonic() + self.ready_timeout_s
                for member in members:
                    self._await(member, deadline, "restarted")
                return
            except StartupFailed:
                stop_all([m.child for m in members if m.child is not None], 0.0)
                component.last_exit = component.child.returncode if component.child is not None else None

    def _members(self, component: Supervised) -> list[Supervised]:
        """What restarts with ``component``: its group in start order, or itself alone."""
        if component.group is None:
            return [component]
        return [c for c in self.components if c.group == component.group]

    def _await(self, component: Supervised, deadline: float, event: Event) -> None:
        child = component.child if component.child is not None else component.launch()
        child.await_ready(deadline)
        component.became_ready()
        self._on_event(component, event)
