"""tracker.proto's route timings <-> core values: what gateways measured serving requests
(``ReportRouteTiming``). Decoded into validated values at the edge, like ``work_wire``."""

from __future__ import annotations

from meshnet.core.tracking import MAX_ROUTE_HOPS, RouteTiming
from meshnet.wire.generated import tracker_pb2 as pb
from meshnet.wire.tracker_wire import node_id_from_proto


def timing_to_proto(timing: RouteTiming) -> pb.RouteTiming:
    return pb.RouteTiming(
        node_ids=list(timing.hops), decode_ms_per_token=timing.decode_ms_per_token, tokens=timing.tokens
    )


def timing_from_proto(message: pb.RouteTiming) -> RouteTiming:
    # One past the bound, so an oversized list is refused by the value rather than cut to fit.
    hops = tuple(node_id_from_proto(node_id) for node_id in message.node_ids[: MAX_ROUTE_HOPS + 1])
    return RouteTiming(hops=hops, decode_ms_per_token=message.decode_ms_per_token, tokens=message.tokens)


def timing_ack_to_proto(accepted: bool) -> pb.RouteTimingAck:
    return pb.RouteTimingAck(accepted=accepted)


def timing_ack_from_proto(message: pb.RouteTimingAck) -> bool:
    return message.accepted
