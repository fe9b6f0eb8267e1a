"""The tracker's overload decision: least important calls shed first, live work never, and
retry hints that grow with the backlog."""

from __future__ import annotations

import contextlib
import itertools
from typing import cast

import grpc
import pytest
from manual_clock import ManualClock

from meshnet.core.errors import TrackerBusy, Unauthenticated
from meshnet.tracker.admission import (
    DEFAULT_LIMITS,
    Admission,
    AdmissionLimits,
    CallClass,
    ClassLimit,
    Pressure,
    decide,
)
from meshnet.tracker.registry import NodeRegistry
from meshnet.tracker.service import TrackerServicer
from meshnet.tracker.status_service import SwarmStatusServicer
from meshnet.tracker.store_runner import StoreRunner
from meshnet.wire.tls import LinkSecurity

ORDER: tuple[CallClass, ...] = ("probe", "registration", "new_session", "live")
PRESSURES = [
    Pressure(in_flight, lag)
    for in_flight, lag in itertools.product((0, 10, 63, 64, 127, 128, 511, 512, 5000), (0.0, 0.19, 0.2, 0.5, 2.0, 60.0))
]


@pytest.mark.parametrize("pressure", PRESSURES)
def test_a_more_important_call_is_never_shed_while_a_less_important_one_is_served(pressure: Pressure) -> None:
    shed = [decide(call, pressure) is not None for call in ORDER]
    assert shed == sorted(shed, reverse=True)  # True (shed) only on a prefix of the order
    assert not shed[-1]  # heartbeats and live sessions' routes: never


def test_each_class_is_shed_from_its_threshold_of_calls_in_flight_or_of_lag() -> None:
    for call in ("probe", "registration", "new_session"):
        limit = DEFAULT_LIMITS.limit(call)
        assert limit is not None
        assert decide(call, Pressure(limit.in_flight - 1, 0.0)) is None
        assert decide(call, Pressure(limit.in_flight, 0.0)) is not None
        assert decide(call, Pressure(0, limit.lag_s * 0.99)) is None
        assert decide(call, Pressure(0, limit.lag_s)) is not None


def test_the_retry_hint_grows_with_the_backlog_up_to_its_cap() -> None:
    limits = AdmissionLimits(probe=ClassLimit(in_flight=10, lag_s=1.0), base_retry_s=0.5, max_retry_s=4.0)
    hints = []
    for in_flight in (10, 20, 40, 1000):
        shed = decide("probe", Pressure(in_flight, 0.0), limits)
        assert shed is not None
        hints.append(shed.retry_after_s)
    assert hints == [0.5, 1.0, 2.0, 4.0]
    by_lag = decide("probe", Pressure(0, 3.0), limits)
    assert by_lag is not None and by_lag.retry_after_s == 1.5 and "late" in by_lag.reason


def test_admission_counts_handlers_in_flight_and_sheds_with_a_retry_hint() -> None:
    lag = [0.0]
    limits = AdmissionLimits(probe=ClassLimit(in_flight=2, lag_s=1.0), registration=ClassLimit(in_flight=3, lag_s=2.0))
    admission = Admission(lambda: lag[0], limits)
    with admission.handling("live"), admission.handling("registration"):
        assert admission.pressure() == Pressure(2, 0.0)
        assert admission.sheds("probe") and not admission.sheds("registration")
        with pytest.raises(TrackerBusy) as busy, admission.handling("probe"):
            pytest.fail("a shed call's handler must not run")
        assert busy.value.retry_after_s == limits.base_retry_s
    assert admission.pressure() == Pressure(0, 0.0) and admission.shed_count == 1
    with pytest.raises(ValueError), admission.handling("probe"):
        raise ValueError("a handler that fails still leaves the count")
    assert admission.pressure().in_flight == 0
    lag[0] = 5.0  # the loop is behind: registrations go too, a heartbeat is still served
    assert admission.sheds("registration")
    with admission.handling("live"):
        pass


def test_shedding_registrations_is_reported_as_strain_from_when_it_starts_to_when_it_ends() -> None:
    """Review item 3's signal: the time admission sheds registrations is deaf time."""
    lag, reports = [0.0], []
    admission = Admission(lambda: lag[0], strain=lambda source, on: reports.append((source, on)))
    admission.check("live")
    lag[0] = DEFAULT_LIMITS.registration.lag_s
    with pytest.raises(TrackerBusy):
        admission.check("registration")
    lag[0] = 0.0
    admission.check("probe")
    assert reports == [("admission", False), ("admission", True), ("admission", False)]


class _Stranger:
    """A link whose caller presented no valid certificate."""

    revocations = None

    def peer(self, context: object) -> None:
        raise Unauthenticated("no client certificate")


def test_a_caller_is_authenticated_before_it_is_shed_and_every_servicer_shares_one_admission() -> None:
    """Review items 11 and 6: a stranger gets its authentication error, never a retry hint; and
    the Tracker, SwarmStatus and Swarm servicers shed by the registry's one Admission."""
    registry = NodeRegistry(clock=ManualClock(1000.0), heartbeat_interval_s=2.0)
    servicer = TrackerServicer(registry, cast(StoreRunner, None), ManualClock(1000.0), cast(LinkSecurity, _Stranger()))
    assert servicer.admission is registry.admission
    assert SwarmStatusServicer(registry).admission is registry.admission
    with contextlib.ExitStack() as pressed:  # enough handlers in flight that probes are shed
        for _ in range(DEFAULT_LIMITS.probe.in_flight):
            pressed.enter_context(registry.admission.counting())
        with pytest.raises(Unauthenticated):
            servicer.admit(cast(grpc.aio.ServicerContext, None), "ListModels", shed="probe")
        assert registry.admission.shed_count == 0
        servicer_open = TrackerServicer(registry, cast(StoreRunner, None), ManualClock(1000.0))
        with pytest.raises(TrackerBusy):
            servicer_open.admit(cast(grpc.aio.ServicerContext, None), "ListModels", shed="probe")
