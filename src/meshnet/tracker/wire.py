"""The tracker's side of the wire: tracker.proto messages in, typed values out, and back.

Requests are decoded into validated core values before any state is touched, so malformed
input becomes ``InvalidArgument`` (INVALID_ARGUMENT) at the edge. The client does the mirror
conversions in ``meshnet.client.tracker_client``; the two never import each other because the
tracker and the client are independent layers.
"""

from __future__ import annotations

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.recipe import Recipe
from meshnet.core.tracking import (
    MAX_LAYERS,
    MAX_PEERS,
    HardwareSummary,
    ModelSummary,
    NodeLoad,
    NodeRegistration,
    NodeWork,
    Route,
    WorkRecord,
    WorkStatus,
    check_count,
    check_text,
)
from meshnet.protocol.generated import tracker_pb2 as pb
from meshnet.tracker.registry import RouteQuery

MAX_EXCLUDED = 1024

_STATUS_FROM_WIRE: dict[int, WorkStatus] = {
    pb.WorkRecord.STATUS_COMPLETED: "completed",
    pb.WorkRecord.STATUS_CANCELLED: "cancelled",
    pb.WorkRecord.STATUS_FAILED: "failed",
    pb.WorkRecord.STATUS_UNVERIFIED: "unverified",
}


def node_id_from_wire(text: str) -> NodeId:
    check_text("node_id", text)
    return NodeId(text)


def recipe_from_wire(message: pb.NodeRegistration.Recipe) -> Recipe:
    texts = {
        "model_sha256": message.model_sha256,
        "architecture": message.architecture,
        "adapter_version": message.adapter_version,
        "weight_quantization": message.weight_quantization,
        "activation_dtype": message.activation_dtype,
        "kv_dtype": message.kv_dtype,
        "backend": message.backend,
        "backend_version": message.backend_version,
        "boundary_schema": message.boundary_schema,
    }
    for name, value in texts.items():
        check_text(f"recipe.{name}", value)
    if not 1 <= message.n_layers <= MAX_LAYERS:
        raise InvalidArgument(f"recipe.n_layers must be in [1, {MAX_LAYERS}], got {message.n_layers}")
    check_count("recipe.n_embd", message.n_embd, 1 << 20)
    return Recipe(n_layers=message.n_layers, n_embd=message.n_embd, **texts)


def registration_from_wire(message: pb.NodeRegistration) -> tuple[NodeRegistration, NodeId | None]:
    """The registration and the node id the worker asks to keep, if any."""
    if not message.HasField("recipe"):
        raise InvalidArgument("registration has no recipe")
    registration = NodeRegistration(
        address=message.address,
        recipe=recipe_from_wire(message.recipe),
        fingerprint=message.fingerprint,
        model=message.model,
        quantization=message.quantization,
        layers=LayerRange(message.layer_start, message.layer_stop),
        hardware=HardwareSummary(message.hardware.cpu_count, message.hardware.memory_bytes),
        max_sessions=message.max_sessions,
        prefill_tokens_per_s=message.measured.prefill_tokens_per_s,
        decode_tokens_per_s=message.measured.decode_tokens_per_s,
        certified=message.certified,
    )
    hint = node_id_from_wire(message.node_id_hint) if message.node_id_hint else None
    return registration, hint


def heartbeat_from_wire(message: pb.NodeHeartbeat) -> tuple[NodeId, NodeLoad]:
    load = NodeLoad(
        active_sessions=message.active_sessions,
        free_sessions=message.free_sessions,
        queue_depth=message.queue_depth,
        kv_used_fraction=message.kv_used_fraction,
        load=message.load,
        peer_rtt_ms=tuple((peer.address, peer.rtt_ms) for peer in message.peers[: MAX_PEERS + 1]),
    )
    return node_id_from_wire(message.node_id), load


def route_query_from_wire(message: pb.RouteRequest) -> RouteQuery:
    check_text("model", message.model)
    if len(message.exclude_node_ids) > MAX_EXCLUDED:
        raise InvalidArgument(f"at most {MAX_EXCLUDED} excluded nodes, got {len(message.exclude_node_ids)}")
    if message.session_id:
        check_text("session_id", message.session_id)
    return RouteQuery(
        model=message.model,
        session_id=SessionId(message.session_id) if message.session_id else None,
        exclude=frozenset(node_id_from_wire(node_id) for node_id in message.exclude_node_ids),
        start_layer=message.require_start_layer if message.HasField("require_start_layer") else None,
    )


def route_to_wire(route: Route) -> pb.RouteReply:
    return pb.RouteReply(
        hops=[
            pb.RouteReply.Hop(
                node_id=hop.node_id,
                address=hop.address,
                layer_start=hop.layers.start,
                layer_stop=hop.layers.stop,
                fingerprint=route.fingerprint,
            )
            for hop in route.hops
        ],
        epoch=route.epoch,
        model=route.model,
        quantization=route.quantization,
        n_layers=route.n_layers,
        estimated_ms_per_token=route.ms_per_token,
    )


def work_from_wire(message: pb.WorkRecord) -> WorkRecord:
    status = _STATUS_FROM_WIRE.get(message.status)
    if status is None:
        raise InvalidArgument(f"work record status {message.status} is not completed, cancelled, failed or unverified")
    check_text("request_id", message.request_id)
    return WorkRecord(
        request_id=RequestId(message.request_id),
        session_id=SessionId(message.session_id) if message.session_id else None,
        model=message.model,
        status=status,
        tokens_in=message.tokens_in,
        tokens_out=message.tokens_out,
        attribution=tuple(
            NodeWork(
                node_id=node_id_from_wire(share.node_id),
                layers=LayerRange(share.layer_start, share.layer_stop),
                tokens=share.tokens,
            )
            for share in message.attribution
        ),
        billing_units=message.billing_units,
        started_at=message.started_at_unix_s,
        finished_at=message.finished_at_unix_s,
    )


def models_to_wire(models: tuple[ModelSummary, ...], epoch: int) -> pb.ModelList:
    return pb.ModelList(
        models=[
            pb.ModelList.Model(
                name=model.name,
                fingerprint=model.fingerprint,
                quantization=model.quantization,
                n_layers=model.n_layers,
                nodes=model.nodes,
                routable=model.routable,
                head_sessions=model.head_sessions,
            )
            for model in models
        ],
        epoch=epoch,
    )
