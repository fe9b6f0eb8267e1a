"""Which decode steps pass their hops' timings on, and whose hop each timing is."""

from __future__ import annotations

from meshnet.core.events import HopLatency, RouteHop
from meshnet.core.ids import NodeId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeCapability
from meshnet.route.hop_timing import HOP_TIMING_EVERY, hop_latencies, timing_due
from meshnet.wire.frames import HopTiming

CAPABILITY = NodeCapability(64, 8, 64, 1 << 20, 8, 1)
ROUTE = (
    RouteHop(NodeId("head"), "10.0.0.1:1", LayerRange(0, 2), CAPABILITY),
    RouteHop(NodeId("middle"), "relay.example:9/n", LayerRange(2, 4), CAPABILITY),
    RouteHop(NodeId("tail"), "10.0.0.3:1", LayerRange(4, 6), CAPABILITY),
)


def test_the_first_decode_step_and_every_nth_after_it_are_sampled() -> None:
    due = [step for step in range(-1, 3 * HOP_TIMING_EVERY) if timing_due(step)]
    assert due == [0, HOP_TIMING_EVERY, 2 * HOP_TIMING_EVERY]
    assert [step for step in range(6) if timing_due(step, every=1)] == list(range(6))
    assert not timing_due(-1, every=1), "the prefill's answer is not a decode step"


def test_timings_are_matched_to_hops_by_layer_range_not_address() -> None:
    timings = (
        HopTiming("10.0.0.1:1", LayerRange(0, 2), 0, 1_500),
        HopTiming("10.0.0.2:1", LayerRange(2, 4), 100, 2_400),  # relayed: it reports its own address
        HopTiming("10.0.0.3:1", LayerRange(4, 6), 0, 7_000),
    )
    assert hop_latencies(ROUTE, timings) == (
        HopLatency(NodeId("head"), 0.0015),
        HopLatency(NodeId("middle"), 0.0025),
        HopLatency(NodeId("tail"), 0.007),
    )


def test_a_timing_of_no_hop_or_a_repeat_is_left_out() -> None:
    timings = (
        HopTiming("10.0.0.9:1", LayerRange(0, 3), 0, 1_000),  # no hop of this route runs 0:3
        HopTiming("10.0.0.3:1", LayerRange(4, 6), 0, 2_000),
        HopTiming("10.0.0.3:1", LayerRange(4, 6), 0, 9_000),
    )
    assert hop_latencies(ROUTE, timings) == (HopLatency(NodeId("tail"), 0.002),)
    assert hop_latencies(ROUTE, ()) == ()
