"""Async client of the tracker, and the worker's register-and-heartbeat loop.

Workers keep themselves routable with ``heartbeat_loop``; the gateway asks ``choose_route`` and
files ``report_work``. Every call carries a deadline, and every failure arrives as a typed core
error (``meshnet.wire.status``): ``NoRoute`` when the swarm cannot serve the model,
``Unavailable`` when the tracker cannot be reached, ``DeadlineExceeded`` when it is too slow.

Messages are built and read by ``meshnet.wire.tracker_wire``, the module the tracker uses
for the other side of each call; the values exchanged are those of ``meshnet.core.tracking``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc
import grpc.aio

from meshnet.core.errors import DeadlineExceeded, FailedPrecondition, MeshnetError, Unavailable
from meshnet.core.ids import NodeId, SessionId
from meshnet.core.layer_costs import LayerAdvice, LayerQuestion
from meshnet.core.node_record import NodeRecord
from meshnet.core.swarm_status import NodeTable
from meshnet.core.tracking import (
    HeartbeatStatus,
    ModelSummary,
    NodeLoad,
    Quarantined,
    QuarantineOrder,
    Registered,
    Route,
    RouteQuery,
    WorkAck,
    WorkRecord,
)
from meshnet.wire import placement_wire, services, work_wire
from meshnet.wire import tracker_wire as wire
from meshnet.wire.status import error_from_rpc
from meshnet.wire.status_wire import node_table_from_proto
from meshnet.wire.tls import TRACKER_NAME, LinkSecurity, secure_or_plain_channel

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
                    {"service": services.TRACKER_SERVICE, "method": "ReportWork"},
                    {"service": services.TRACKER_SERVICE, "method": "ListModels"},
                    {"service": services.TRACKER_SERVICE, "method": "SuggestLayers"},
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


class TrackerClient:
    """One channel to one tracker. Create it inside the event loop that uses it."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        security: LinkSecurity | None = None,
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
        self._security = security
        self._options = options
        self._generation = 0 if security is None else security.generation
        self._channel = secure_or_plain_channel(address, security, TRACKER_NAME, options)
        self._stub = services.TrackerStub(self._channel)
        self._retired: list[grpc.aio.Channel] = []
        self._status_stub = services.SwarmStatusStub(self._channel)

    async def __aenter__(self) -> TrackerClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        for retired in self._retired:
            await retired.close()
        await self._channel.close()

    def _current_stub(self) -> services.TrackerStub:
        """The stub over a channel made with this process's current certificate."""
        if self._security is not None and self._security.generation != self._generation:
            self._generation = self._security.generation
            self._retired.append(self._channel)
            self._channel = secure_or_plain_channel(self.address, self._security, TRACKER_NAME, self._options)
            self._stub = services.TrackerStub(self._channel)
            self._status_stub = services.SwarmStatusStub(self._channel)
        return self._stub

    async def register(
        self,
        registration: NodeRecord,
        *,
        node_id_hint: NodeId | None = None,
        timeout_s: float | None = None,
    ) -> Registered:
        request = wire.registration_to_proto(registration, node_id_hint)
        return wire.registered_from_proto(await self._call(self._current_stub().Register, request, timeout_s))

    async def heartbeat(self, node_id: NodeId, load: NodeLoad, *, timeout_s: float | None = None) -> HeartbeatStatus:
        request = wire.heartbeat_to_proto(node_id, load)
        return wire.heartbeat_status_from_proto(await self._call(self._current_stub().Heartbeat, request, timeout_s))

    async def choose_route(
        self,
        model: str,
        *,
        session_id: SessionId | None = None,
        exclude: Iterable[NodeId] = (),
        timeout_s: float | None = None,
    ) -> Route:
        """A route for ``model`` (name or fingerprint); each hop carries its node's capability."""
        request = wire.route_query_to_proto(RouteQuery(model, session_id, frozenset(exclude)))
        return wire.route_from_proto(await self._call(self._current_stub().ChooseRoute, request, timeout_s))

    async def report_work(self, record: WorkRecord, *, timeout_s: float | None = None) -> WorkAck:
        """Store ``record``; safe to repeat (idempotent by request id) until it is acknowledged."""
        reply = await self._call(self._current_stub().ReportWork, work_wire.work_to_proto(record), timeout_s)
        return work_wire.work_ack_from_proto(reply)

    async def list_models(self, *, timeout_s: float | None = None) -> tuple[ModelSummary, ...]:
        reply = await self._call(self._current_stub().ListModels, wire.list_models_request_to_proto(), timeout_s)
        models, _epoch = wire.models_from_proto(reply)
        return models

    async def list_nodes(self, *, timeout_s: float | None = None) -> NodeTable:
        """The tracker's live node table (the SwarmStatus service beside the tracker's own)."""
        reply = await self._call(self._status_stub.ListNodes, services.ListNodesRequest(), timeout_s)
        return node_table_from_proto(reply)

    async def deregister(self, node_id: NodeId, *, timeout_s: float | None = None) -> bool:
        reply = await self._call(self._current_stub().Deregister, wire.deregister_to_proto(node_id), timeout_s)
        return wire.deregistered_from_proto(reply).known

    async def quarantine(self, order: QuarantineOrder, *, timeout_s: float | None = None) -> Quarantined:
        """Report an audit verdict (or, with ``order.clear``, lift one)."""
        reply = await self._call(self._stub.Quarantine, work_wire.quarantine_to_proto(order), timeout_s)
        return work_wire.quarantined_from_proto(reply)

    async def suggest_layers(self, question: LayerQuestion, *, timeout_s: float | None = None) -> LayerAdvice:
        """The range the swarm needs most that fits ``question``'s budget (``--layers auto``)."""
        reply = await self._call(self._stub.SuggestLayers, placement_wire.question_to_proto(question), timeout_s)
        return placement_wire.advice_from_proto(reply, question.costs.n_layers)

    async def _call(self, method: Callable[..., Awaitable[Any]], request: Any, timeout_s: float | None) -> Any:
        try:
            return await method(request, timeout=timeout_s or self._timeout_s)
        except grpc.RpcError as rpc_error:
            error = error_from_rpc(rpc_error)
            raise _with_context(error, f"tracker {self.address}: {error.message}") from rpc_error


async def heartbeat_loop(
    client: TrackerClient,
    registration: NodeRecord,
    load_fn: Callable[[], NodeLoad],
    stop_event: asyncio.Event,
    *,
    on_registered: Callable[[Registered], None] | None = None,
    on_epoch: Callable[[int], None] | None = None,
    on_probe: Callable[[tuple[str, ...]], None] | None = None,
    on_revoked: Callable[[frozenset[str]], None] | None = None,
) -> None:
    """Keep ``registration`` routable until ``stop_event`` is set, then deregister.

    Registers, heartbeats every interval the tracker asks for, and registers again (keeping
    the node id) whenever the tracker says it forgot us, which is how a worker rejoins after
    a tracker restart. An unreachable tracker is logged and retried; it never stops the worker.
    """
    membership = _Membership(client, registration, load_fn, on_registered, on_probe, on_revoked)
    last_epoch: int | None = None
    while not stop_event.is_set():
        try:
            epoch = await membership.step()
            if epoch is None:
                continue  # forgotten: register again at once
            if on_epoch is not None and epoch != last_epoch:
                on_epoch(epoch)
            last_epoch = epoch
        except (Unavailable, DeadlineExceeded) as error:
            logger.warning("tracker %s unreachable: %s", client.address, error.message)
        except FailedPrecondition as error:
            # Refused for good (a quarantined id): retrying cannot help, and this node must stay dark.
            logger.error("tracker %s refuses this node: %s", client.address, error.message)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop_event.wait(), timeout=membership.interval_s)
    await membership.leave()


class _Membership:
    """One worker's standing with one tracker: registered or not, under which id, how often to beat."""

    def __init__(
        self,
        client: TrackerClient,
        registration: NodeRecord,
        load_fn: Callable[[], NodeLoad],
        on_registered: Callable[[Registered], None] | None,
        on_probe: Callable[[tuple[str, ...]], None] | None,
        on_revoked: Callable[[frozenset[str]], None] | None = None,
    ) -> None:
        self._client = client
        self._on_revoked = on_revoked
        self._registration = registration
        self._load_fn = load_fn
        self._on_registered = on_registered
        self._on_probe = on_probe
        self._registered: Registered | None = None
        self._node_id_hint: NodeId | None = None
        """The id to ask for when registering again, so a rejoining worker keeps its identity."""
        self.interval_s = 1.0

    async def step(self) -> int | None:
        """Register or heartbeat once: the tracker's epoch, or None when it forgot this node."""
        if self._registered is None:
            return await self._register()
        # A reply later than one interval is worth nothing: the next beat is due.
        status = await self._client.heartbeat(self._registered.node_id, self._load_fn(), timeout_s=self.interval_s)
        if not status.known:
            logger.warning("tracker %s forgot %s; registering again", self._client.address, self._registered.node_id)
            self._registered = None
            return None
        if self._on_probe is not None:
            self._on_probe(status.probe)
        if self._on_revoked is not None:
            self._on_revoked(frozenset(status.revoked))
        return status.epoch

    async def _register(self) -> int:
        registered = await self._client.register(self._registration, node_id_hint=self._node_id_hint)
        self._registered = registered
        self._node_id_hint, self.interval_s = registered.node_id, registered.heartbeat_interval_s
        logger.info("registered with tracker %s as %s", self._client.address, registered.node_id)
        if self._on_registered is not None:
            self._on_registered(registered)
        return registered.epoch

    async def leave(self) -> None:
        if self._registered is not None:
            with contextlib.suppress(MeshnetError):
                await self._client.deregister(self._registered.node_id, timeout_s=min(self.interval_s, 1.0))


def _with_context(error: MeshnetError, message: str) -> MeshnetError:
    try:
        return type(error)(message)
    except TypeError:  # a subclass with a richer constructor: keep it as it is
        return error
