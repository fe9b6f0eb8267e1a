"""Async client of the tracker, and the worker's register-and-heartbeat loop.

Workers keep themselves routable with ``heartbeat_loop``; the gateway asks ``choose_route`` and
files ``report_work``. Every call carries a deadline, and every failure arrives as a typed core
error (``meshnet.protocol.status``): ``NoRoute`` when the swarm cannot serve the model,
``Unavailable`` when the tracker cannot be reached, ``DeadlineExceeded`` when it is too slow.

The message conversions here mirror ``meshnet.tracker.wire``: this side encodes requests and
decodes replies. The client and tracker are independent layers, so neither imports the other;
they share the values in ``meshnet.core.tracking`` and the schema in tracker.proto.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from meshnet.core.errors import DeadlineExceeded, MeshnetError, Unavailable
from meshnet.core.events import RouteHop
from meshnet.core.ids import NodeId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.tracking import (
    MAX_PEERS,
    ModelSummary,
    NodeLoad,
    NodeRegistration,
    Route,
    WorkRecord,
)
from meshnet.protocol.generated import tracker_pb2 as pb
from meshnet.protocol.generated import tracker_pb2_grpc as pb_grpc
from meshnet.protocol.status import error_from_rpc

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
RECONNECT_BACKOFF_MS = (100, 1000)
"""First and longest wait between attempts to reconnect to the tracker."""

# gRPC retries a call transparently only under this policy. Only idempotent calls get one:
# ReportWork is keyed by request id, so a retry after a lost reply is stored once. UNAVAILABLE
# here can only be the transport, since the tracker answers UNAVAILABLE only to ChooseRoute.
_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [
                    {"service": "meshnet.v1.Tracker", "method": "ReportWork"},
                    {"service": "meshnet.v1.Tracker", "method": "ListModels"},
                ],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)

_STATUS_TO_WIRE = {
    "completed": pb.WorkRecord.STATUS_COMPLETED,
    "cancelled": pb.WorkRecord.STATUS_CANCELLED,
    "failed": pb.WorkRecord.STATUS_FAILED,
    "unverified": pb.WorkRecord.STATUS_UNVERIFIED,
}


@dataclass(frozen=True)
class Registered:
    node_id: NodeId
    heartbeat_interval_s: float
    epoch: int


@dataclass(frozen=True)
class HeartbeatStatus:
    known: bool
    """False: the tracker forgot this node (it expired or the tracker restarted); register again."""
    epoch: int
    probe: tuple[str, ...] = ()
    """Candidate next hops whose round trip this node should measure and report."""


@dataclass(frozen=True)
class WorkAck:
    request_id: str
    duplicate: bool
    """True: the tracker had stored this exact record already."""


class TrackerClient:
    """One channel to one tracker. Create it inside the event loop that uses it."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.address = address
        self._timeout_s = timeout_s
        options = [
            ("grpc.service_config", _SERVICE_CONFIG),
            ("grpc.enable_retries", 1),
            # gRPC's default reconnect backoff grows toward 120 s; after a tracker restart every
            # worker must be back within a heartbeat or two, so retry the connection briskly.
            ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
            ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
            ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[1]),
        ]
        if credentials is None:
            self._channel = grpc.aio.insecure_channel(address, options=options)
        else:
            self._channel = grpc.aio.secure_channel(address, credentials, options=options)
        self._stub = pb_grpc.TrackerStub(self._channel)

    async def __aenter__(self) -> TrackerClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def register(
        self,
        registration: NodeRegistration,
        *,
        node_id_hint: NodeId | None = None,
        timeout_s: float | None = None,
    ) -> Registered:
        request = registration_to_wire(registration, node_id_hint)
        reply = await self._call(self._stub.Register, request, timeout_s)
        return Registered(NodeId(reply.node_id), reply.heartbeat_interval_ms / 1000, reply.epoch)

    async def heartbeat(self, node_id: NodeId, load: NodeLoad, *, timeout_s: float | None = None) -> HeartbeatStatus:
        request = pb.NodeHeartbeat(
            node_id=node_id,
            active_sessions=load.active_sessions,
            free_sessions=load.free_sessions,
            queue_depth=load.queue_depth,
            kv_used_fraction=load.kv_used_fraction,
            load=load.load,
            peers=[pb.PeerLatency(address=address, rtt_ms=rtt) for address, rtt in load.peer_rtt_ms],
        )
        reply = await self._call(self._stub.Heartbeat, request, timeout_s)
        return HeartbeatStatus(reply.known, reply.epoch, tuple(reply.probe[:MAX_PEERS]))

    async def choose_route(
        self,
        model: str,
        *,
        session_id: SessionId | None = None,
        exclude: Iterable[NodeId] = (),
        start_layer: int | None = None,
        timeout_s: float | None = None,
    ) -> Route:
        """A route for ``model`` (name or fingerprint). With ``start_layer`` (failover of a
        sub-span), pass the current route's fingerprint as ``model`` and keep its earlier hops."""
        request = pb.RouteRequest(model=model, session_id=session_id or "", exclude_node_ids=sorted(exclude))
        if start_layer is not None:
            request.require_start_layer = start_layer
        reply = await self._call(self._stub.ChooseRoute, request, timeout_s)
        return route_from_wire(reply)

    async def report_work(self, record: WorkRecord, *, timeout_s: float | None = None) -> WorkAck:
        """Store ``record``; safe to repeat (idempotent by request id) until it is acknowledged."""
        reply = await self._call(self._stub.ReportWork, work_to_wire(record), timeout_s)
        return WorkAck(reply.request_id, reply.duplicate)

    async def list_models(self, *, timeout_s: float | None = None) -> tuple[ModelSummary, ...]:
        reply = await self._call(self._stub.ListModels, pb.ListModelsRequest(), timeout_s)
        return tuple(
            ModelSummary(m.name, m.fingerprint, m.quantization, m.n_layers, m.nodes, m.routable, m.head_sessions)
            for m in reply.models
        )

    async def deregister(self, node_id: NodeId, *, timeout_s: float | None = None) -> bool:
        request = pb.DeregisterRequest(node_id=node_id)
        reply = await self._call(self._stub.Deregister, request, timeout_s)
        return bool(reply.known)

    async def _call(self, method: Callable[..., Awaitable[Any]], request: Any, timeout_s: float | None) -> Any:
        try:
            return await method(request, timeout=timeout_s or self._timeout_s)
        except grpc.RpcError as rpc_error:
            error = error_from_rpc(rpc_error)
            raise _with_context(error, f"tracker {self.address}: {error.message}") from rpc_error


def registration_to_wire(registration: NodeRegistration, node_id_hint: NodeId | None = None) -> pb.NodeRegistration:
    recipe = registration.recipe
    return pb.NodeRegistration(
        address=registration.address,
        recipe=pb.NodeRegistration.Recipe(
            model_sha256=recipe.model_sha256,
            architecture=recipe.architecture,
            adapter_version=recipe.adapter_version,
            weight_quantization=recipe.weight_quantization,
            activation_dtype=recipe.activation_dtype,
            kv_dtype=recipe.kv_dtype,
            backend=recipe.backend,
            backend_version=recipe.backend_version,
            n_layers=recipe.n_layers,
            n_embd=recipe.n_embd,
            boundary_schema=recipe.boundary_schema,
        ),
        fingerprint=registration.fingerprint,
        model=registration.model,
        quantization=registration.quantization,
        layer_start=registration.layers.start,
        layer_stop=registration.layers.stop,
        hardware=pb.NodeRegistration.Hardware(
            cpu_count=registration.hardware.cpu_count,
            memory_bytes=registration.hardware.memory_bytes,
        ),
        max_sessions=registration.max_sessions,
        measured=pb.NodeRegistration.Measured(
            prefill_tokens_per_s=registration.prefill_tokens_per_s,
            decode_tokens_per_s=registration.decode_tokens_per_s,
        ),
        certified=registration.certified,
        node_id_hint=node_id_hint or "",
    )


def route_from_wire(reply: pb.RouteReply) -> Route:
    """Decode and check a route; a malformed one is the tracker's fault, so it is Unavailable."""
    fingerprints = {hop.fingerprint for hop in reply.hops}
    if len(fingerprints) != 1:
        raise Unavailable(f"the tracker sent a route with recipes {sorted(fingerprints)}; refusing it")
    try:
        return Route(
            hops=tuple(
                RouteHop(NodeId(hop.node_id), hop.address, LayerRange(hop.layer_start, hop.layer_stop))
                for hop in reply.hops
            ),
            epoch=reply.epoch,
            model=reply.model,
            quantization=reply.quantization,
            fingerprint=fingerprints.pop(),
            n_layers=reply.n_layers,
            ms_per_token=reply.estimated_ms_per_token,
        )
    except MeshnetError as error:
        raise Unavailable(f"the tracker sent a malformed route: {error.message}") from error


def work_to_wire(record: WorkRecord) -> pb.WorkRecord:
    return pb.WorkRecord(
        request_id=record.request_id,
        session_id=record.session_id or "",
        model=record.model,
        status=_STATUS_TO_WIRE[record.status],
        tokens_in=record.tokens_in,
        tokens_out=record.tokens_out,
        attribution=[
            pb.WorkRecord.NodeShare(
                node_id=share.node_id,
                layer_start=share.layers.start,
                layer_stop=share.layers.stop,
                tokens=share.tokens,
            )
            for share in record.attribution
        ],
        billing_units=record.billing_units,
        started_at_unix_s=record.started_at,
        finished_at_unix_s=record.finished_at,
    )


async def heartbeat_loop(
    client: TrackerClient,
    registration: NodeRegistration,
    load_fn: Callable[[], NodeLoad],
    stop_event: asyncio.Event,
    *,
    on_registered: Callable[[Registered], None] | None = None,
    on_epoch: Callable[[int], None] | None = None,
    on_probe: Callable[[tuple[str, ...]], None] | None = None,
) -> None:
    """Keep ``registration`` routable until ``stop_event`` is set, then deregister.

    Registers, heartbeats every interval the tracker asks for, and registers again (keeping
    the node id) whenever the tracker says it forgot us, which is how a worker rejoins after
    a tracker restart. An unreachable tracker is logged and retried; it never stops the worker.
    """
    registered: Registered | None = None
    node_id_hint: NodeId | None = None
    interval_s = 1.0
    last_epoch: int | None = None
    while not stop_event.is_set():
        try:
            if registered is None:
                registered = await client.register(registration, node_id_hint=node_id_hint)
                node_id_hint, interval_s, epoch = (
                    registered.node_id,
                    registered.heartbeat_interval_s,
                    registered.epoch,
                )
                logger.info("registered with tracker %s as %s", client.address, registered.node_id)
                if on_registered is not None:
                    on_registered(registered)
            else:
                # A reply later than one interval is worth nothing: the next beat is due.
                status = await client.heartbeat(registered.node_id, load_fn(), timeout_s=interval_s)
                epoch = status.epoch
                if on_probe is not None and status.known:
                    on_probe(status.probe)
                if not status.known:
                    logger.warning(
                        "tracker %s forgot %s; registering again",
                        client.address,
                        registered.node_id,
                    )
                    registered = None
                    continue
            if on_epoch is not None and epoch != last_epoch:
                on_epoch(epoch)
            last_epoch = epoch
        except (Unavailable, DeadlineExceeded) as error:
            logger.warning("tracker %s unreachable: %s", client.address, error.message)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop_event.wait(), timeout=interval_s)
    if registered is not None:
        with contextlib.suppress(MeshnetError):
            await client.deregister(registered.node_id, timeout_s=min(interval_s, 1.0))


def _with_context(error: MeshnetError, message: str) -> MeshnetError:
    try:
        return type(error)(message)
    except TypeError:  # a subclass with a richer constructor: keep it as it is
        return error
