"""Graceful overload: which calls a tracker behind on its work sheds, and how long it asks them to wait.

A tracker that tries to answer everything when it is behind answers nothing on time: heartbeats
time out, live nodes look dead, they register again and add to the load (the collapse issue 36
measured). So it sheds explicitly, with ``TrackerBusy`` (RESOURCE_EXHAUSTED and a retry hint that
crosses the wire as ``meshnet-retry-after-ms``), least important calls first:

- ``probe``: route probes without a session, status and list calls, route timings, and the
  peer-probe list inside a heartbeat's reply (the heartbeat itself is still taken);
- ``registration``: a node joining (it retries later, jittered by the client); under this much
  pressure a heartbeat is only counted as heard (``NodeRegistry.heard``), its load report skipped;
- ``new_session``: the first route of a session (a user's new request);
- ``live``: heartbeats of registered nodes and routes of live sessions, deregistrations, work
  records: never shed, since shedding them is what turns lateness into lost nodes and sessions.

Pressure is what the tracker can measure about itself cheaply: handlers in flight (calls it has
started and not answered, waiting on the store or a dial-back) and the event loop's lag
(``tracker.liveness.Hearing``: how late its sweep task runs). ``decide`` is the pure decision;
``Admission`` counts handlers and asks it. There is one ``Admission`` per tracker (the registry
owns it): a Register flood is pressure on Join, Renew and ListNodes too. A call is shed only
after its caller is authenticated (``check`` goes after the servicer's ``admit``): an unknown or
revoked caller gets its authentication error, never a retry hint.

Calls that queue inside gRPC's own queues never reach a handler, so neither signal sees them;
time while registrations are shed is therefore reported to ``tracker.liveness`` as strain
(deaf time), the fallback that keeps such queues from expiring nodes.

Retry hints grow with the backlog, so a storm spreads itself out instead of coming back all at once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from meshnet.core.errors import TrackerBusy

logger = logging.getLogger(__name__)

CallClass = Literal["probe", "registration", "new_session", "live"]
"""How much a call matters while the tracker is behind, least first (see the module docstring)."""


@dataclass(frozen=True)
class Pressure:
    """How far behind the tracker is now."""

    in_flight: int
    """Handlers started and not yet answered."""
    lag_s: float
    """How late the event loop runs what it scheduled (``Hearing.recent_lag_s``)."""


@dataclass(frozen=True)
class ClassLimit:
    """Where one class of calls starts being shed."""

    in_flight: int
    lag_s: float


@dataclass(frozen=True)
class AdmissionLimits:
    """When each class is shed; the defaults keep a one-core tracker's heartbeats well under a
    second late (their expiry window is several heartbeat intervals)."""

    probe: ClassLimit = ClassLimit(in_flight=64, lag_s=0.2)
    registration: ClassLimit = ClassLimit(in_flight=128, lag_s=0.5)
    new_session: ClassLimit = ClassLimit(in_flight=512, lag_s=2.0)
    base_retry_s: float = 0.5
    """The hint at the threshold; it grows in proportion to how far past it the tracker is."""
    max_retry_s: float = 30.0
    """Never ask a caller to wait longer than this: the pressure may be gone in a moment."""

    def limit(self, call: CallClass) -> ClassLimit | None:
        """None: the class is never shed."""
        if call == "probe":
            return self.probe
        if call == "registration":
            return self.registration
        if call == "new_session":
            return self.new_session
        return None


DEFAULT_LIMITS = AdmissionLimits()


@dataclass(frozen=True)
class Shed:
    """Refuse the call: ask again after ``retry_after_s`` (the client adds jitter)."""

    retry_after_s: float
    reason: str


def decide(call: CallClass, pressure: Pressure, limits: AdmissionLimits = DEFAULT_LIMITS) -> Shed | None:
    """Whether to shed a ``call`` under ``pressure``; None: serve it."""
    limit = limits.limit(call)
    if limit is None:
        return None
    flight = pressure.in_flight / limit.in_flight
    lag = pressure.lag_s / limit.lag_s
    over = max(flight, lag)
    if over < 1.0:
        return None
    retry = min(limits.max_retry_s, limits.base_retry_s * over)
    if flight >= lag:
        reason = f"{pressure.in_flight} calls in flight (a {call} is shed from {limit.in_flight})"
    else:
        reason = f"its work runs {pressure.lag_s:.2f} s late (a {call} is shed from {limit.lag_s:.2f} s)"
    return Shed(retry, reason)


class Admission:
    """Counts the handlers in flight and sheds calls by ``decide``. One event loop, no locks."""

    def __init__(
        self,
        lag_s: Callable[[], float],
        limits: AdmissionLimits = DEFAULT_LIMITS,
        strain: Callable[[str, bool], None] | None = None,
    ) -> None:
        self._lag_s = lag_s
        self._limits = limits
        self._strain = strain
        """Told whether registrations are being shed (``Hearing.strain``), at every decision."""
        self._in_flight = 0
        self.shed_count = 0
        """Calls refused so far, for status and tests."""

    def pressure(self) -> Pressure:
        return Pressure(self._in_flight, self._lag_s())

    def sheds(self, call: CallClass) -> bool:
        """Whether a ``call`` would be shed now (for work skipped inside a call that is served)."""
        return decide(call, self.pressure(), self._limits) is not None

    def check(self, call: CallClass) -> None:
        """Raise ``TrackerBusy`` if a ``call`` is shed now; call it once the caller is authenticated."""
        pressure = self.pressure()
        if self._strain is not None:
            self._strain("admission", decide("registration", pressure, self._limits) is not None)
        shed = decide(call, pressure, self._limits)
        if shed is not None:
            self.shed_count += 1
            logger.debug("shedding a %s call: %s", call, shed.reason)
            raise TrackerBusy(f"the tracker is busy: {shed.reason}; ask again later", shed.retry_after_s)

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """Count the handler in the ``with`` body in flight (it decides shedding with ``check``)."""
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1

    @contextlib.contextmanager
    def handling(self, call: CallClass) -> Iterator[None]:
        """Serve the handler in the ``with`` body, counted in flight, or raise ``TrackerBusy``:
        for calls with no caller to authenticate first (or never shed)."""
        self.check(call)
        with self.counting():
            yield
