"""Route timings cross the wire unchanged, and a malformed one is refused at the edge."""

from __future__ import annotations

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId
from meshnet.core.tracking import MAX_ROUTE_HOPS, RouteTiming
from meshnet.wire import speed_wire
from meshnet.wire.generated import tracker_pb2 as pb


def test_a_timing_round_trips() -> None:
    timing = RouteTiming((NodeId("w-head"), NodeId("w-tail")), 6.25, tokens=16)
    assert speed_wire.timing_from_proto(speed_wire.timing_to_proto(timing)) == timing
    assert speed_wire.timing_ack_from_proto(speed_wire.timing_ack_to_proto(True)) is True


@pytest.mark.parametrize(
    "message",
    [
        pb.RouteTiming(node_ids=[], decode_ms_per_token=1.0, tokens=4),
        pb.RouteTiming(node_ids=["a", "a"], decode_ms_per_token=1.0, tokens=4),
        pb.RouteTiming(node_ids=["a"], decode_ms_per_token=-1.0, tokens=4),
        pb.RouteTiming(node_ids=["a"], decode_ms_per_token=float("inf"), tokens=4),
        pb.RouteTiming(node_ids=["a"], decode_ms_per_token=1.0, tokens=1),
        pb.RouteTiming(node_ids=[f"n{i}" for i in range(MAX_ROUTE_HOPS + 5)], decode_ms_per_token=1.0, tokens=4),
        pb.RouteTiming(node_ids=["bad\nid"], decode_ms_per_token=1.0, tokens=4),
    ],
)
def test_a_malformed_timing_is_refused(message: pb.RouteTiming) -> None:
    with pytest.raises(InvalidArgument):
        speed_wire.timing_from_proto(message)
