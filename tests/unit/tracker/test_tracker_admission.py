"""The tracker's overload decision: least important calls shed first, live work never, and
retry hints that grow with the backlog."""

from __future__ import annotations

import itertools

import pytest

from meshnet.core.errors import TrackerBusy
from meshnet.tracker.admission import (
    DEFAULT_LIMITS,
    Admission,
    AdmissionLimits,
    CallClass,
    ClassLimit,
    Pressure,
    decide,
)

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
