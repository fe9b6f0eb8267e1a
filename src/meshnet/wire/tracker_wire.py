"""tracker.proto messages <-> the typed values of ``meshnet.core.tracking``, one message at a time.

Both ends use this module: the tracker decodes requests and encodes replies, the client (workers
and the gateway) encodes requests and decodes replies; the shard messages have their twin module
in ``shard_wire``. Each message's encoder and decoder sit side by side, so adding a field touches
the proto, the core value and one pair here.

Requests are decoded into validated core values before the tracker touches any state, so
malformed input becomes ``InvalidArgument`` (INVALID_ARGUMENT) at the edge. A malformed route
is the tracker's fault, not the caller's, so the client-side decoder reports it as ``Unavailable``.
"""

from __future__ import annotations

import math
from typing import Any

from meshnet.core.checks import check_text
from meshnet.core.errors import InvalidArgument, MeshnetError, Unavailable
from meshnet.core.events import RouteHop
from meshnet.core.ids import NodeId, RequestId, SessionId, check_node_id
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeRecord
from meshnet.core.reachability import DeclaredReachability, check_declared, check_reachability
from meshnet.core.tracking import (
    MAX_PEERS,
    MAX_PREFIX_TIPS,
    MAX_ROUTE_CHAIN,
    Deregistered,
    HeartbeatStatus,
    ModelSummary,
    NodeLoad,
    PrefixFigures,
    Registered,
    Route,
    RouteQuery,
)
from meshnet.wire.generated import tracker_pb2 as pb
from meshnet.wire.node_wire import capability_from_proto, capability_to_proto, record_from_proto, record_to_proto
from meshnet.wire.ticket_wire import sealed_from_proto, sealed_to_proto

MAX_EXCLUDED = 1024
MAX_KNOWN_EPOCH = 2**62
"""Half a frame's largest route epoch (``frames.MAX_EPOCH``): moving above a reported epoch
leaves the epoch room to grow for ever."""
MAX_TICKET_SECONDS = 2**32 - 1


def node_id_from_proto(text: str) -> NodeId:
    check_text("node_id", text)
    return NodeId(text)


# --- Register -----------------------------------------------------------------------------------


def registration_to_proto(
    record: NodeRecord, node_id: NodeId, known_epoch: int = 0, declared: DeclaredReachability = "auto"
) -> pb.NodeRegistration:
    return pb.NodeRegistration(
        record=record_to_proto(record), node_id=node_id, known_epoch=known_epoch, reachability=declared
    )


def registration_from_proto(message: pb.NodeRegistration) -> tuple[NodeRecord, NodeId]:
    """The node's record and its id (one DNS label, see ``NodeId``)."""
    if not message.HasField("record"):
        raise InvalidArgument("the registration carries no node record")
    if not message.node_id:
        raise InvalidArgument("a registration names its node id")
    return record_from_proto(message.record), check_node_id(message.node_id)


def known_epoch_from_proto(message: pb.NodeRegistration) -> int:
    """The highest epoch the registering node was told (0: none), at most ``MAX_KNOWN_EPOCH``."""
    if message.known_epoch > MAX_KNOWN_EPOCH:
        raise InvalidArgument(f"known_epoch {message.known_epoch} is beyond any epoch a tracker hands out")
    return int(message.known_epoch)


def declared_from_proto(message: pb.NodeRegistration) -> DeclaredReachability:
    """What the registering node says of its reachability (``auto`` when it says nothing)."""
    return check_declared(message.reachability)


def registered_to_proto(registered: Registered) -> pb.RegisterReply:
    return pb.RegisterReply(
        node_id=registered.node_id,
        heartbeat_interval_ms=round(registered.heartbeat_interval_s * 1000),
        epoch=registered.epoch,
        reachability=registered.reachability,
    )


def registered_from_proto(message: pb.RegisterReply) -> Registered:
    try:
        reachability = check_reachability(message.reachability)
    except InvalidArgument as error:
        raise Unavailable(f"the tracker's registration reply is malformed: {error.message}") from None
    return Registered(NodeId(message.node_id), message.heartbeat_interval_ms / 1000, message.epoch, reachability)


# --- Heartbeat ----------------------------------------------------------------------------------


def heartbeat_to_proto(node_id: NodeId, load: NodeLoad) -> pb.NodeHeartbeat:
    return pb.NodeHeartbeat(
        node_id=node_id,
        active_sessions=load.active_sessions,
        free_sessions=load.free_sessions,
        queue_depth=load.queue_depth,
        kv_used_fraction=load.kv_used_fraction,
        peers=[pb.PeerLatency(address=address, rtt_ms=rtt) for address, rtt in load.peer_rtt_ms],
        memory_used_bytes=load.memory_used_bytes,
        memory_budget_bytes=load.memory_budget_bytes,
        prefix_tips=[pb.PrefixTip(link=link, blocks=blocks) for link, blocks in load.prefix_tips],
        **prefix_figures_fields(load.prefix),
    )


def prefix_figures_fields(figures: PrefixFigures | None) -> dict[str, Any]:
    """A message's prefix store fields (``NodeHeartbeat``'s, ``NodeStatusList.Node``'s)."""
    if figures is None:
        return {}
    return {
        "prefix_reported": True,
        "prefix_bytes": figures.bytes_held,
        "prefix_budget_bytes": figures.budget_bytes,
        "prefix_hits": figures.hits,
        "prefix_misses": figures.misses,
    }


def heartbeat_from_proto(message: pb.NodeHeartbeat) -> tuple[NodeId, NodeLoad]:
    load = NodeLoad(
        active_sessions=message.active_sessions,
        free_sessions=message.free_sessions,
        queue_depth=message.queue_depth,
        kv_used_fraction=message.kv_used_fraction,
        # One past the limit, so an oversized list is refused by NodeLoad rather than cut short.
        peer_rtt_ms=tuple((peer.address, peer.rtt_ms) for peer in message.peers[: MAX_PEERS + 1]),
        memory_used_bytes=message.memory_used_bytes,
        memory_budget_bytes=message.memory_budget_bytes,
        prefix_tips=tuple((tip.link, tip.blocks) for tip in message.prefix_tips[: MAX_PREFIX_TIPS + 1]),
        prefix=prefix_figures_from(message),
    )
    return node_id_from_proto(message.node_id), load


def prefix_figures_from(message: pb.NodeHeartbeat | Any) -> PrefixFigures | None:
    """The prefix store figures of a message with ``prefix_figures_fields``; None: not reported."""
    if not message.prefix_reported:
        return None
    return PrefixFigures(message.prefix_bytes, message.prefix_budget_bytes, message.prefix_hits, message.prefix_misses)


def heartbeat_status_to_proto(status: HeartbeatStatus) -> pb.HeartbeatReply:
    return pb.HeartbeatReply(known=status.known, epoch=status.epoch, probe=status.probe)


def heartbeat_status_from_proto(message: pb.HeartbeatReply) -> HeartbeatStatus:
    return HeartbeatStatus(message.known, message.epoch, tuple(message.probe[:MAX_PEERS]))


# --- WatchRevocations ---------------------------------------------------------------------------


def watch_revocations_to_proto() -> pb.WatchRevocationsRequest:
    return pb.WatchRevocationsRequest()


def revocations_to_proto(revoked: frozenset[str]) -> pb.RevocationList:
    return pb.RevocationList(revoked_node_ids=sorted(revoked))


def revocations_from_proto(message: pb.RevocationList) -> frozenset[str]:
    """The revoked node ids; a list the tracker garbled is its fault, so ``Unavailable``."""
    try:
        for node_id in message.revoked_node_ids:
            check_text("revoked node id", node_id)
    except InvalidArgument as error:
        raise Unavailable(f"the tracker sent a malformed revocation list: {error.message}") from None
    return frozenset(message.revoked_node_ids)


# --- ChooseRoute --------------------------------------------------------------------------------


def route_query_to_proto(query: RouteQuery) -> pb.RouteRequest:
    return pb.RouteRequest(
        model=query.model,
        session_id=query.session_id or "",
        exclude_node_ids=sorted(query.exclude),
        request_id=query.request_id or "",
        ticket_seconds=min(math.ceil(query.ticket_seconds), MAX_TICKET_SECONDS),
        unbilled=query.unbilled,
        prefix_chain=query.prefix_chain,
    )


def route_query_from_proto(message: pb.RouteRequest) -> RouteQuery:
    check_text("model", message.model)
    if len(message.exclude_node_ids) > MAX_EXCLUDED:
        raise InvalidArgument(f"at most {MAX_EXCLUDED} excluded nodes, got {len(message.exclude_node_ids)}")
    if message.session_id:
        check_text("session_id", message.session_id)
    if message.request_id:
        check_text("request_id", message.request_id)
    return RouteQuery(
        model=message.model,
        session_id=SessionId(message.session_id) if message.session_id else None,
        exclude=frozenset(node_id_from_proto(node_id) for node_id in message.exclude_node_ids),
        request_id=RequestId(message.request_id) if message.request_id else None,
        ticket_seconds=float(message.ticket_seconds),
        unbilled=message.unbilled,
        # One past the limit, so an oversized chain is refused by RouteQuery rather than cut short.
        prefix_chain=tuple(message.prefix_chain[: MAX_ROUTE_CHAIN + 1]),
    )


def route_to_proto(route: Route) -> pb.RouteReply:
    return pb.RouteReply(
        hops=[
            pb.RouteReply.Hop(
                node_id=hop.node_id,
                address=hop.address,
                layer_start=hop.layers.start,
                layer_stop=hop.layers.stop,
                fingerprint=route.fingerprint,
                capability=capability_to_proto(hop.capability),
            )
            for hop in route.hops
        ],
        epoch=route.epoch,
        model=route.model,
        quantization=route.quantization,
        n_layers=route.n_layers,
        estimated_ms_per_token=route.ms_per_token,
        ticket=None if route.ticket is None else sealed_to_proto(route.ticket),
    )


def route_from_proto(message: pb.RouteReply) -> Route:
    """Decode and check a route; a malformed one is the tracker's fault, so it is Unavailable."""
    fingerprints = {hop.fingerprint for hop in message.hops}
    if len(fingerprints) != 1:
        raise Unavailable(f"the tracker sent a route with recipes {sorted(fingerprints)}; refusing it")
    try:
        return Route(
            hops=tuple(_hop_from_proto(hop) for hop in message.hops),
            epoch=message.epoch,
            model=message.model,
            quantization=message.quantization,
            fingerprint=fingerprints.pop(),
            n_layers=message.n_layers,
            ms_per_token=message.estimated_ms_per_token,
            ticket=sealed_from_proto(message.ticket) if message.HasField("ticket") else None,
        )
    except MeshnetError as error:
        raise Unavailable(f"the tracker sent a malformed route: {error.message}") from error


def _hop_from_proto(hop: pb.RouteReply.Hop) -> RouteHop:
    check_text("hop address", hop.address)
    if not hop.HasField("capability"):
        raise InvalidArgument(f"hop {hop.address} carries no capability")
    return RouteHop(
        node_id_from_proto(hop.node_id),
        hop.address,
        LayerRange(hop.layer_start, hop.layer_stop),
        capability_from_proto(hop.capability),
    )


# --- ListModels ---------------------------------------------------------------------------------


def list_models_request_to_proto() -> pb.ListModelsRequest:
    return pb.ListModelsRequest()


def models_to_proto(models: tuple[ModelSummary, ...], epoch: int) -> pb.ModelList:
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


def models_from_proto(message: pb.ModelList) -> tuple[tuple[ModelSummary, ...], int]:
    """The models the swarm serves, and the epoch they were listed at."""
    models = tuple(
        ModelSummary(m.name, m.fingerprint, m.quantization, m.n_layers, m.nodes, m.routable, m.head_sessions)
        for m in message.models
    )
    return models, message.epoch


# --- Deregister ---------------------------------------------------------------------------------


def deregister_to_proto(node_id: NodeId) -> pb.DeregisterRequest:
    return pb.DeregisterRequest(node_id=node_id)


def deregister_from_proto(message: pb.DeregisterRequest) -> NodeId:
    return node_id_from_proto(message.node_id)


def deregistered_to_proto(reply: Deregistered) -> pb.DeregisterReply:
    return pb.DeregisterReply(known=reply.known, epoch=reply.epoch)


def deregistered_from_proto(message: pb.DeregisterReply) -> Deregistered:
    return Deregistered(message.known, message.epoch)
