"""The network sweep's judgement: each point against its rate's 0 ms point plus the delays crossed."""

from __future__ import annotations

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.deploy.lab.relay_sweep import compare
from meshnet.deploy.lab.sweep import SweepPoint, with_limits


def _point(delay_ms: float, rate: float, per_token_ms: float) -> SweepPoint:
    return SweepPoint(
        delay_ms=delay_ms,
        bandwidth_mbit=rate,
        ttft_ms=100.0,
        decode_tok_s=1000.0 / per_token_ms,
        per_token_ms=per_token_ms,
        compute_ms=5.0,
        prefill_prompt_tokens=10,
        prefill_ttft_ms=50.0,
        prefill_seam_bytes=3000,
        prefill_seam_payload_bytes=2560,
    )


def test_a_three_hop_path_crosses_four_delay_lines_and_a_ring_three() -> None:
    points = [_point(0, 100, 20.0), _point(5, 100, 42.0), _point(0, 1000, 10.0), _point(5, 1000, 30.0)]
    judged = with_limits(points, hops=3)
    assert [p.limit_path_ms for p in judged] == [20.0, 40.0, 10.0, 30.0]
    assert [p.limit_ring_ms for p in judged] == [20.0, 35.0, 10.0, 25.0]
    # The route is a ring: judged against the ring's limit, the tighter one.
    assert judged[1].ratio_to_limit == pytest.approx(42.0 / 35.0)
    assert judged[3].ratio_to_limit == pytest.approx(30.0 / 25.0)


def test_a_rate_without_its_zero_delay_point_cannot_be_judged() -> None:
    with pytest.raises(InvalidArgument, match="no 0 ms point at 100 Mbit"):
        with_limits([_point(5, 100, 42.0)], hops=3)


def test_the_relayed_hop_is_judged_against_the_direct_one_less_its_extra_delay() -> None:
    direct, relayed = _point(5, 100, 40.0), _point(5, 100, 45.8)
    point = compare(5.0, 100.0, direct, relayed)
    assert point.overhead_ms == pytest.approx(5.8)
    # One more one-way delay per token (the relay's link crossed in and out), one relay crossing.
    assert point.processing_per_crossing_ms == pytest.approx(0.8)
    assert compare(0.0, 100.0, _point(0, 100, 20.0), _point(0, 100, 20.3)).processing_per_crossing_ms == pytest.approx(
        0.3
    )
