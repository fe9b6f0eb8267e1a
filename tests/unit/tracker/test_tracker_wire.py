"""Both ends of tracker.proto agree: every message survives encode -> bytes -> decode unchanged,
and what arrives malformed is refused with a typed error."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, TypeVar

import pytest
from google.protobuf.message import Message
from hypothesis import given
from hypothesis import strategies as st
from tracker_samples import FINGERPRINT, MODEL, OTHER_FINGERPRINT, capability, registration, work_record

from meshnet.core.errors import InvalidArgument, Unavailable
from meshnet.core.events import RouteHop
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.prefix import PrefixKey, prefix_chain
from meshnet.core.reachability import REACHABILITIES, Reachability
from meshnet.core.tracking import (
    MAX_PEERS,
    MAX_PREFIX_TIPS,
    MAX_ROUTE_CHAIN,
    REPORTED_STATUSES,
    Deregistered,
    HeartbeatStatus,
    ModelSummary,
    NodeLoad,
    PrefixFigures,
    Registered,
    Route,
    RouteQuery,
    SessionTokens,
    WorkAck,
    WorkStatus,
)
from meshnet.wire import tracker_wire as wire
from meshnet.wire import work_wire
from meshnet.wire.generated import tracker_pb2 as pb

M = TypeVar("M", bound=Message)

ids = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=32)
counts = st.integers(0, 10_000)
epochs = st.integers(0, 2**63 - 1)


def over_the_wire(message: M) -> M:
    """The message as the other end parses it."""
    return type(message).FromString(message.SerializeToString())


NODE = NodeId("w-9")


def test_registration_round_trips_with_its_node_id() -> None:
    sent = registration(3, 17, address="10.0.0.2:7000")
    decoded, node_id = wire.registration_from_proto(over_the_wire(wire.registration_to_proto(sent, NODE)))
    assert decoded == sent and node_id == "w-9"


@pytest.mark.parametrize("node_id", ["", "W-9", "w_9", "-w9", "w" * 64, "tracker.meshnet"])
def test_a_registration_without_one_dns_label_for_its_id_is_refused(node_id: str) -> None:
    """The id is what a caller pins in TLS (``<id>.node.meshnet``): it must be one DNS label."""
    message = wire.registration_to_proto(registration(0, 10), NODE)
    message.node_id = node_id
    with pytest.raises(InvalidArgument, match="node id"):
        wire.registration_from_proto(message)


@given(revoked=st.frozensets(ids, max_size=20))
def test_revocation_lists_round_trip(revoked: frozenset[str]) -> None:
    assert wire.revocations_from_proto(over_the_wire(wire.revocations_to_proto(revoked))) == revoked


def test_a_garbled_revocation_list_is_the_trackers_fault() -> None:
    with pytest.raises(Unavailable, match="revocation list"):
        wire.revocations_from_proto(pb.RevocationList(revoked_node_ids=["w-1", "bad\nid"]))


def test_route_round_trips() -> None:
    route = Route(
        hops=(
            RouteHop(NodeId("a"), "a:1", LayerRange(0, 7), capability(context=512)),
            RouteHop(NodeId("b"), "b:1", LayerRange(7, 20), capability(context=2048, max_sessions=2)),
        ),
        epoch=12,
        model=MODEL,
        quantization="Q4_1",
        fingerprint=FINGERPRINT,
        n_layers=20,
        ms_per_token=3.25,
    )
    assert wire.route_from_proto(over_the_wire(wire.route_to_proto(route))) == route


@pytest.mark.parametrize("status", REPORTED_STATUSES)
def test_every_work_status_round_trips(status: WorkStatus) -> None:
    record = replace(work_record("req-8"), status=status)
    assert work_wire.work_from_proto(over_the_wire(work_wire.work_to_proto(record))) == record


@pytest.mark.parametrize("status", ["disputed", "completed_by_shards"])
def test_the_trackers_verdicts_are_no_status_a_gateway_can_report(status: WorkStatus) -> None:
    with pytest.raises(InvalidArgument, match="only the tracker sets"):
        work_wire.work_to_proto(replace(work_record("req-9"), status=status))


def test_route_queries_and_session_counts_round_trip() -> None:
    query = RouteQuery(MODEL, SessionId("s-1"), frozenset({NodeId("w-1")}), RequestId("req-1"))
    assert wire.route_query_from_proto(over_the_wire(wire.route_query_to_proto(query))) == query
    counts = (SessionTokens(SessionId("s-1"), 3, 27, 7), SessionTokens(SessionId("s-2"), 1, 5, 0))
    message = over_the_wire(work_wire.session_tokens_to_proto(NodeId("w-1"), counts))
    assert work_wire.session_tokens_from_proto(message) == (NodeId("w-1"), counts)


def test_prefix_chains_tips_and_prefix_figures_round_trip() -> None:
    chain = prefix_chain(PrefixKey(FINGERPRINT, 4), list(range(12)))
    query = RouteQuery(MODEL, SessionId("s-1"), prefix_chain=chain)
    assert wire.route_query_from_proto(over_the_wire(wire.route_query_to_proto(query))) == query
    load = NodeLoad(free_sessions=2, prefix_tips=((chain[2], 3), (chain[0], 1)), prefix=PrefixFigures(10, 20, 3, 4))
    message = over_the_wire(wire.heartbeat_to_proto(NodeId("n-1"), load))
    assert wire.heartbeat_from_proto(message) == ("n-1", load)
    assert wire.heartbeat_from_proto(over_the_wire(wire.heartbeat_to_proto(NodeId("n-1"), NodeLoad()))) == (
        "n-1",
        NodeLoad(),
    ), "no figures reported reads as none, not as zeros"
    with pytest.raises(InvalidArgument):
        wire.route_query_from_proto(pb.RouteRequest(model=MODEL, prefix_chain=[chain[0]] * (MAX_ROUTE_CHAIN + 1)))


def test_model_list_carries_the_head_session_slots() -> None:
    summary = ModelSummary(MODEL, FINGERPRINT, "Q8_0", 20, 3, True, head_sessions=12)
    (sent,) = wire.models_to_proto((summary,), epoch=1).models
    assert sent.head_sessions == 12
    assert wire.models_from_proto(over_the_wire(wire.models_to_proto((summary,), epoch=1)))[0] == (summary,)


def test_work_record_round_trips() -> None:
    record = work_record("req-7")
    assert work_wire.work_from_proto(over_the_wire(work_wire.work_to_proto(record))) == record
    anonymous = replace(work_record("req-8", tokens_out=0), session_id=None, status="cancelled")
    assert work_wire.work_from_proto(over_the_wire(work_wire.work_to_proto(anonymous))) == anonymous


def test_route_query_decodes_its_session_and_exclusions() -> None:
    plain = wire.route_query_from_proto(pb.RouteRequest(model=MODEL))
    assert plain.session_id is None and plain.exclude == frozenset()
    failover = wire.route_query_from_proto(pb.RouteRequest(model=MODEL, session_id="s-1", exclude_node_ids=["x"]))
    assert failover.session_id == SessionId("s-1") and failover.exclude == {"x"}


@given(model=ids, session_id=st.none() | ids, exclude=st.frozensets(ids, max_size=8))
def test_route_query_round_trips(model: str, session_id: str | None, exclude: frozenset[str]) -> None:
    query = RouteQuery(
        model,
        None if session_id is None else SessionId(session_id),
        frozenset(NodeId(node_id) for node_id in exclude),
    )
    assert wire.route_query_from_proto(over_the_wire(wire.route_query_to_proto(query))) == query


@given(
    node_id=ids,
    interval_ms=st.integers(1, 2**32 - 1),
    epoch=epochs,
    reachability=st.sampled_from(REACHABILITIES),
)
def test_register_reply_round_trips(node_id: str, interval_ms: int, epoch: int, reachability: Reachability) -> None:
    registered = Registered(NodeId(node_id), interval_ms / 1000, epoch, reachability)
    assert wire.registered_from_proto(over_the_wire(wire.registered_to_proto(registered))) == registered


def test_a_registration_carries_what_the_node_declares_and_a_reply_what_the_tracker_registered() -> None:
    message = wire.registration_to_proto(registration(0, 4), NodeId("w-1"), declared="private")
    assert wire.declared_from_proto(over_the_wire(message)) == "private"
    assert wire.declared_from_proto(wire.registration_to_proto(registration(0, 4), NodeId("w-1"))) == "auto"
    message.reachability = "relayed"  # the tracker's verdict, not a node's to declare
    with pytest.raises(InvalidArgument, match="reachability must be one of"):
        wire.declared_from_proto(message)
    reply = wire.registered_to_proto(Registered(NodeId("w-1"), 1.0, 3, "private"))
    reply.reachability = "hidden"
    with pytest.raises(Unavailable, match="malformed"):
        wire.registered_from_proto(reply)


peer_latencies = st.lists(st.tuples(ids, st.floats(0.0, 600_000.0, allow_nan=False)), max_size=MAX_PEERS).map(tuple)


@given(
    node_id=ids,
    active=counts,
    free=counts,
    queue=counts,
    kv_used=st.floats(0.0, 1.0),
    peers=peer_latencies,
)
def test_heartbeat_round_trips(
    node_id: str, active: int, free: int, queue: int, kv_used: float, peers: tuple[tuple[str, float], ...]
) -> None:
    load = NodeLoad(active, free, queue, kv_used, peers)
    message = over_the_wire(wire.heartbeat_to_proto(NodeId(node_id), load))
    assert wire.heartbeat_from_proto(message) == (node_id, load)


@given(known=st.booleans(), epoch=epochs, probe=st.lists(ids, max_size=MAX_PEERS).map(tuple))
def test_heartbeat_reply_round_trips(known: bool, epoch: int, probe: tuple[str, ...]) -> None:
    status = HeartbeatStatus(known, epoch, probe)
    assert wire.heartbeat_status_from_proto(over_the_wire(wire.heartbeat_status_to_proto(status))) == status


@given(request_id=ids, duplicate=st.booleans())
def test_work_ack_round_trips(request_id: str, duplicate: bool) -> None:
    ack = WorkAck(RequestId(request_id), duplicate)
    assert work_wire.work_ack_from_proto(over_the_wire(work_wire.work_ack_to_proto(ack))) == ack


model_summaries = st.builds(
    ModelSummary,
    name=ids,
    fingerprint=ids,
    quantization=st.text(max_size=8),
    n_layers=st.integers(1, 1000),
    nodes=counts,
    routable=st.booleans(),
)


@given(models=st.lists(model_summaries, max_size=5).map(tuple), epoch=epochs)
def test_model_list_round_trips(models: tuple[ModelSummary, ...], epoch: int) -> None:
    assert wire.models_from_proto(over_the_wire(wire.models_to_proto(models, epoch))) == (models, epoch)


@given(node_id=ids, known=st.booleans(), epoch=epochs)
def test_deregister_round_trips(node_id: str, known: bool, epoch: int) -> None:
    assert wire.deregister_from_proto(over_the_wire(wire.deregister_to_proto(NodeId(node_id)))) == node_id
    reply = Deregistered(known, epoch)
    assert wire.deregistered_from_proto(over_the_wire(wire.deregistered_to_proto(reply))) == reply


def test_a_deregistration_without_node_id_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="node_id"):
        wire.deregister_from_proto(pb.DeregisterRequest())


def _tampered(**fields: object) -> pb.NodeRegistration:
    message = wire.registration_to_proto(registration(0, 10), NODE)
    for name, value in fields.items():
        target = message.record if name != "node_id" else message
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
        {"capability__max_sessions": 0},
        {"capability__decode_tokens_per_s": math.nan},
        {"capability__decode_tokens_per_s": -1.0},
        {"capability__n_ctx_per_session": 0},
        {"capability__n_ctx_per_session": 2**31},  # past int32 positions
        {"capability__prefill_chunk_tokens": 0},
        {"capability__max_tokens_per_frame": 0},
        {"capability__max_frame_bytes": 2**40},
        {"capability__n_embd": 65},  # the recipe's is 64
        {"capability__device": "tpu"},
        {"capability__device": ""},
        {"certification__whole_sha256": "ab"},  # not a sha256
        {"certification__digest": "AB" * 32},  # not lowercase hex
        {"certification__fingerprint": ""},
        {"certification__backend_version": "x" * 1000},
        {"address": ""},
        {"address": "x" * 1000},
        {"model": "bad\nname"},
        {"node_id": "\x00"},
        {"recipe__architecture": ""},
    ],
)
def test_malformed_registrations_are_invalid_arguments(fields: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        wire.registration_from_proto(_tampered(**fields))


@pytest.mark.parametrize("part", ["recipe", "hardware", "capability", "certification"])
def test_a_record_without_one_of_its_parts_is_refused(part: str) -> None:
    message = wire.registration_to_proto(registration(0, 10), NODE)
    message.record.ClearField(part)
    with pytest.raises(InvalidArgument, match=f"no {part}"):
        wire.registration_from_proto(message)
    message.ClearField("record")
    with pytest.raises(InvalidArgument, match="no node record"):
        wire.registration_from_proto(message)


def test_a_certification_listing_too_many_checks_is_refused() -> None:
    message = wire.registration_to_proto(registration(0, 10), NODE)
    message.record.certification.checks.extend(["bit-identical"] * 300)
    with pytest.raises(InvalidArgument, match="certification checks"):
        wire.registration_from_proto(message)


def test_a_route_hop_without_its_capability_is_the_trackers_fault() -> None:
    route = Route(
        (RouteHop(NodeId("a"), "a:1", LayerRange(0, 20), capability()),), 1, MODEL, "Q4_1", FINGERPRINT, 20, 1.0
    )
    message = wire.route_to_proto(route)
    message.hops[0].ClearField("capability")
    with pytest.raises(Unavailable, match="carries no capability"):
        wire.route_from_proto(message)
    message = wire.route_to_proto(route)
    message.hops[0].capability.n_ctx_per_session = 0
    with pytest.raises(Unavailable, match="n_ctx_per_session"):
        wire.route_from_proto(message)


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
    message = work_wire.work_to_proto(work_record())
    for name, value in fields.items():
        setattr(message, name, value)
    with pytest.raises(InvalidArgument):
        work_wire.work_from_proto(message)


@pytest.mark.parametrize(
    "fields",
    [
        {"node_id": ""},
        {"kv_used_fraction": 1.5},
        {"kv_used_fraction": math.nan},
        {"peers": [pb.PeerLatency(address="a:1", rtt_ms=-1.0)]},
        {"peers": [pb.PeerLatency(address="a:1", rtt_ms=1.0)] * (MAX_PEERS + 1)},
        {"prefix_tips": [pb.PrefixTip(link=b"short", blocks=1)]},
        {"prefix_tips": [pb.PrefixTip(link=bytes(16), blocks=1)] * (MAX_PREFIX_TIPS + 1)},
    ],
)
def test_malformed_heartbeats_are_invalid_arguments(fields: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        wire.heartbeat_from_proto(pb.NodeHeartbeat(**{"node_id": "n-1", **fields}))


def test_the_client_refuses_a_route_that_mixes_recipes() -> None:
    hops = (
        RouteHop(NodeId("a"), "a:1", LayerRange(0, 10), capability()),
        RouteHop(NodeId("b"), "b:1", LayerRange(10, 20), capability()),
    )
    reply = wire.route_to_proto(Route(hops, 1, MODEL, "Q4_1", FINGERPRINT, 20, 1.0))
    reply.hops[1].fingerprint = OTHER_FINGERPRINT
    with pytest.raises(Unavailable, match="recipes"):
        wire.route_from_proto(reply)
    del reply.hops[1]
    with pytest.raises(Unavailable, match="malformed route: route ends at layer 10, not 20"):
        wire.route_from_proto(reply)


def test_an_expert_group_front_round_trips_with_its_nodes() -> None:
    front = replace(registration(0, 20), expert_group=("127.0.0.1:7001", "127.0.0.1:7002"))
    assert wire.registration_from_proto(over_the_wire(wire.registration_to_proto(front, NODE)))[0] == front
    assert wire.registration_from_proto(wire.registration_to_proto(registration(0, 20), NODE))[0].expert_group == ()


@pytest.mark.parametrize(
    ("start", "stop", "nodes"),
    [(0, 10, ("a:1", "b:1")), (0, 20, ("a:1", "")), (0, 20, ("a:1\n",)), (0, 20, ("a:1",) * 257)],
    ids=["not-every-layer", "empty-address", "bad-address", "too-many"],
)
def test_malformed_expert_group_fronts_are_invalid_arguments(start: int, stop: int, nodes: tuple[str, ...]) -> None:
    message = wire.registration_to_proto(registration(start, stop), NODE)
    message.record.expert_group_nodes.extend(nodes)
    with pytest.raises(InvalidArgument):
        wire.registration_from_proto(message)
