"""Both ends of tracker.proto agree: what the client encodes the tracker decodes, and back."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from tracker_samples import FINGERPRINT, MODEL, OTHER_FINGERPRINT, registration, work_record

from meshnet.client.tracker_client import registration_to_wire, route_from_wire, work_to_wire
from meshnet.core.errors import InvalidArgument, Unavailable
from meshnet.core.events import RouteHop
from meshnet.core.ids import NodeId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.tracking import WORK_STATUSES, ModelSummary, Route, WorkStatus
from meshnet.protocol.generated import tracker_pb2 as pb
from meshnet.tracker import wire


def test_registration_round_trips_with_its_hint() -> None:
    sent = registration(3, 17, address="10.0.0.2:7000")
    decoded, hint = wire.registration_from_wire(registration_to_wire(sent, NodeId("n-9")))
    assert decoded == sent and hint == "n-9"
    assert wire.registration_from_wire(registration_to_wire(sent))[1] is None


def test_route_round_trips() -> None:
    route = Route(
        hops=(
            RouteHop(NodeId("a"), "a:1", LayerRange(0, 7)),
            RouteHop(NodeId("b"), "b:1", LayerRange(7, 20)),
        ),
        epoch=12,
        model=MODEL,
        quantization="Q4_1",
        fingerprint=FINGERPRINT,
        n_layers=20,
        ms_per_token=3.25,
    )
    assert route_from_wire(wire.route_to_wire(route)) == route


def test_work_record_round_trips() -> None:
    record = work_record("req-7")
    assert wire.work_from_wire(work_to_wire(record)) == record


@pytest.mark.parametrize("status", WORK_STATUSES)
def test_every_work_status_round_trips(status: WorkStatus) -> None:
    record = replace(work_record("req-8"), status=status)
    assert wire.work_from_wire(work_to_wire(record)) == record


def test_model_list_carries_the_head_session_slots() -> None:
    summary = ModelSummary(MODEL, FINGERPRINT, "Q8_0", 20, 3, True, head_sessions=12)
    (sent,) = wire.models_to_wire((summary,), epoch=1).models
    assert sent.head_sessions == 12


def test_route_query_decodes_the_optional_start_layer() -> None:
    plain = wire.route_query_from_wire(pb.RouteRequest(model=MODEL))
    assert plain.start_layer is None and plain.session_id is None
    failover = wire.route_query_from_wire(
        pb.RouteRequest(model=MODEL, session_id="s-1", exclude_node_ids=["x"], require_start_layer=0)
    )
    assert failover.start_layer == 0 and failover.session_id == SessionId("s-1")
    assert failover.exclude == {"x"}


def _tampered(**fields: object) -> pb.NodeRegistration:
    message = registration_to_wire(registration(0, 10))
    for name, value in fields.items():
        target = message
        *path, leaf = name.split("__")
        for part in path:
            target = getattr(target, part)
        setattr(target, leaf, value)
    return message


@pytest.mark.parametrize(
    "fields",
    [
        {"fingerprint": OTHER_FINGERPRINT},  # claims a recipe it does not carry
        {"recipe__n_layers": 40},  # changes the recipe under the same fingerprint
        {"layer_start": 10, "layer_stop": 10},  # empty range
        {"layer_stop": 21},  # past the model's last layer
        {"max_sessions": 0},
        {"measured__decode_tokens_per_s": math.nan},
        {"measured__decode_tokens_per_s": -1.0},
        {"address": ""},
        {"address": "x" * 1000},
        {"model": "bad\nname"},
        {"node_id_hint": "\x00"},
        {"recipe__architecture": ""},
    ],
)
def test_malformed_registrations_are_invalid_arguments(fields: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        wire.registration_from_wire(_tampered(**fields))


def test_a_registration_without_recipe_is_refused() -> None:
    message = registration_to_wire(registration(0, 10))
    message.ClearField("recipe")
    with pytest.raises(InvalidArgument, match="no recipe"):
        wire.registration_from_wire(message)


@pytest.mark.parametrize(
    "fields",
    [
        {"status": pb.WorkRecord.STATUS_UNSPECIFIED},
        {"request_id": ""},
        {"billing_units": math.inf},
        {"finished_at_unix_s": 1.0},  # before it started
    ],
)
def test_malformed_work_records_are_invalid_arguments(fields: dict[str, object]) -> None:
    message = work_to_wire(work_record())
    for name, value in fields.items():
        setattr(message, name, value)
    with pytest.raises(InvalidArgument):
        wire.work_from_wire(message)


def test_heartbeat_load_is_bounded() -> None:
    with pytest.raises(InvalidArgument):
        wire.heartbeat_from_wire(pb.NodeHeartbeat(node_id="n-1", kv_used_fraction=1.5))


def test_the_client_refuses_a_route_that_mixes_recipes() -> None:
    reply = pb.RouteReply(
        hops=[
            pb.RouteReply.Hop(node_id="a", address="a:1", layer_start=0, layer_stop=10, fingerprint=FINGERPRINT),
            pb.RouteReply.Hop(
                node_id="b",
                address="b:1",
                layer_start=10,
                layer_stop=20,
                fingerprint=OTHER_FINGERPRINT,
            ),
        ],
        n_layers=20,
    )
    with pytest.raises(Unavailable, match="recipes"):
        route_from_wire(reply)
    del reply.hops[1]
    with pytest.raises(Unavailable, match="malformed"):
        route_from_wire(reply)  # ends at 10 of 20 layers
