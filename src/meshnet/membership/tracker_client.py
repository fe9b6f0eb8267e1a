"""Async client of the tracker: every call a process makes to the tracker's port, over one channel.

Workers register and heartbeat (``membership.heartbeats``), renew (``membership.join``), follow
revocations (``membership.revocations``) and announce what they hold (``membership.announce``);
the gateway asks ``choose_route`` and files ``report_work``; fetchers ask ``find_holders``;
operators list nodes, quarantine and revoke. All of it goes through the one ``RenewingChannel``,
so after a renewal every call presents the new certificate. Every unary call carries a deadline,
and every failure arrives as a typed core error (``meshnet.wire.status``): ``NoRoute`` when the
swarm cannot serve the model, ``Unreachable`` (an ``Unavailable``) when the tracker cannot be reached,
``DeadlineExceeded`` when it is too slow.

Messages are built and read by the ``meshnet.wire`` conversion modules the tracker uses for the
other side of each call; the values exchanged are those of ``meshnet.core``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import grpc
import grpc.aio

from meshnet.artifact.directory import Advertisement, FoundHolders
from meshnet.core.audit_evidence import QuarantineEntry
from meshnet.core.errors import MeshnetError, Unreachable
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layer_costs import LayerAdvice, LayerQuestion
from meshnet.core.node_record import NodeRecord
from meshnet.core.reachability import DeclaredReachability
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
    RouteTiming,
    SessionTokens,
    WorkAck,
    WorkRecord,
)
from meshnet.membership.channel import RenewingChannel
from meshnet.wire import artifact_wire, placement_wire, services, speed_wire, swarm_wire, work_wire
from meshnet.wire import tracker_wire as wire
from meshnet.wire.status import error_from_rpc
from meshnet.wire.status_wire import node_table_from_proto
from meshnet.wire.swarm_wire import IssuedCertificate
from meshnet.wire.tls import TRACKER_NAME, LinkSecurity

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
RECONNECT_BACKOFF_MS = (100, 1000)
"""First and longest wait between attempts to reconnect to the tracker."""
KEEPALIVE_MS = (10_000, 5_000)
"""Ping every 10 s while a call is open, give up 5 s after an unanswered ping: a revocation watch
carries no data for hours and must still notice a tracker that vanished (the tracker's
``SERVER_OPTIONS`` accept these pings)."""

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
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.service_config", _SERVICE_CONFIG),
    ("grpc.enable_retries", 1),
    # gRPC's default reconnect backoff grows toward 120 s; after a tracker restart every
    # worker must be back within a heartbeat or two, so retry the connection briskly.
    ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
    ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
    ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[1]),
    ("grpc.keepalive_time_ms", KEEPALIVE_MS[0]),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_MS[1]),
    # Measured on grpc 1.85 with a frozen (SIGSTOPped) tracker under an open watch: by default
    # only 2 pings go out while no data flows (the watch then went unnoticed for 90 s and more),
    # and a ping waits ``ping_timeout_ms`` (60 s), not the keepalive timeout (69 s); with both
    # set, the watch ended 13 s after the freeze.
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_MS[1]),
]


class TrackerClient:
    """Every call to one tracker, over one channel that follows certificate renewal.

    Create it inside the event loop that uses it."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        security: LinkSecurity | None = None,
    ) -> None:
        self.address = address
        self.security = security
        self._timeout_s = timeout_s
        self._channel = RenewingChannel(address, security, TRACKER_NAME, CHANNEL_OPTIONS)

    async def __aenter__(self) -> TrackerClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    def _tracker(self) -> services.TrackerStub:
        return self._channel.stub(services.TrackerStub)

    # --- membership ------------------------------------------------------------------------

    async def register(
        self,
        registration: NodeRecord,
        node_id: NodeId,
        *,
        known_epoch: int = 0,
        declared: DeclaredReachability = "auto",
        timeout_s: float | None = None,
    ) -> Registered:
        """Register ``registration`` under the node's one id (``NodeId``), saying the highest
        route epoch the node was told (a tracker that lost its state moves above it) and what
        it knows of its reachability (the reply says what the tracker registered)."""
        request = wire.registration_to_proto(registration, node_id, known_epoch, declared)
        return wire.registered_from_proto(await self._call(self._tracker().Register, request, timeout_s))

    async def heartbeat(self, node_id: NodeId, load: NodeLoad, *, timeout_s: float | None = None) -> HeartbeatStatus:
        request = wire.heartbeat_to_proto(node_id, load)
        return wire.heartbeat_status_from_proto(await self._call(self._tracker().Heartbeat, request, timeout_s))

    async def deregister(self, node_id: NodeId, *, timeout_s: float | None = None) -> bool:
        reply = await self._call(self._tracker().Deregister, wire.deregister_to_proto(node_id), timeout_s)
        return wire.deregistered_from_proto(reply).known

    async def suggest_layers(self, question: LayerQuestion, *, timeout_s: float | None = None) -> LayerAdvice:
        """The range the swarm needs most that fits ``question``'s budget (``--layers auto``)."""
        request = placement_wire.question_to_proto(question)
        reply = await self._call(self._tracker().SuggestLayers, request, timeout_s)
        return placement_wire.advice_from_proto(reply, question.costs.n_layers)

    async def watch_revocations(self) -> AsyncIterator[frozenset[str]]:
        """The swarm's revoked node ids now, then again after every change (no deadline: it
        runs until the caller stops iterating or the tracker ends it). ``membership.revocations``
        keeps one open for a process."""
        call = self._tracker().WatchRevocations(wire.watch_revocations_to_proto())
        try:
            async for message in call:
                yield wire.revocations_from_proto(message)
        except grpc.RpcError as rpc_error:
            raise self._error(rpc_error) from rpc_error
        finally:
            call.cancel()

    # --- certificates (the Swarm service on the same port) -----------------------------------

    async def renew(self, csr_pem: bytes, *, timeout_s: float | None = None) -> IssuedCertificate:
        """A certificate for ``csr_pem``'s key, with this client's node id and role."""
        stub = self._channel.stub(services.SwarmStub)
        return swarm_wire.issued_from_proto(await self._call(stub.Renew, swarm_wire.renew_to_proto(csr_pem), timeout_s))

    async def revoke(self, node_id: str, *, timeout_s: float | None = None) -> tuple[bool, bool]:
        """(newly revoked, was routed)."""
        stub = self._channel.stub(services.SwarmStub)
        reply = await self._call(stub.Revoke, swarm_wire.revoke_to_proto(node_id), timeout_s)
        return swarm_wire.revoked_from_proto(reply)

    # --- routing and billing -----------------------------------------------------------------

    async def choose_route(
        self,
        model: str,
        *,
        session_id: SessionId | None = None,
        exclude: Iterable[NodeId] = (),
        request_id: RequestId | None = None,
        timeout_s: float | None = None,
        ticket_seconds: float = 0.0,
        unbilled: bool = False,
        prefix_chain: tuple[bytes, ...] = (),
    ) -> Route:
        """A route for ``model`` (name or fingerprint); each hop carries its node's capability.

        With ``session_id`` it carries the route's ticket for that session (and ``request_id``),
        lasting ``ticket_seconds`` (0: the tracker's default), which every shard checks before
        it opens the session (``core.tickets``). ``request_id`` also lets the tracker check (and,
        if this gateway dies, complete) the request's work record against what the shards count,
        unless ``unbilled`` (an audit replay, whose ticket still names its request).
        ``prefix_chain`` (the prompt's, ``core.prefix``) lets the tracker prefer a route whose
        head holds a prefix of the prompt and keep a conversation on its route."""
        query = RouteQuery(model, session_id, frozenset(exclude), request_id, ticket_seconds, unbilled, prefix_chain)
        request = wire.route_query_to_proto(query)
        return wire.route_from_proto(await self._call(self._tracker().ChooseRoute, request, timeout_s))

    async def report_work(self, record: WorkRecord, *, timeout_s: float | None = None) -> WorkAck:
        """Store ``record``; safe to repeat (idempotent by request id) until it is acknowledged."""
        reply = await self._call(self._tracker().ReportWork, work_wire.work_to_proto(record), timeout_s)
        return work_wire.work_ack_from_proto(reply)

    async def report_session_tokens(
        self, node_id: NodeId, sessions: tuple[SessionTokens, ...], *, timeout_s: float | None = None
    ) -> int:
        """Tell the tracker what this worker computed for sessions that ended; returns how many it counted."""
        request = work_wire.session_tokens_to_proto(node_id, sessions)
        reply = await self._call(self._tracker().ReportSessionTokens, request, timeout_s)
        return work_wire.session_tokens_ack_from_proto(reply)

    async def report_route_timing(self, timing: RouteTiming, *, timeout_s: float | None = None) -> bool:
        """Tell the tracker how fast a route served; True: taken into its measure of node speeds."""
        reply = await self._call(self._tracker().ReportRouteTiming, speed_wire.timing_to_proto(timing), timeout_s)
        return speed_wire.timing_ack_from_proto(reply)

    async def list_models(self, *, timeout_s: float | None = None) -> tuple[ModelSummary, ...]:
        reply = await self._call(self._tracker().ListModels, wire.list_models_request_to_proto(), timeout_s)
        models, _epoch = wire.models_from_proto(reply)
        return models

    async def quarantine(self, order: QuarantineOrder, *, timeout_s: float | None = None) -> Quarantined:
        """Report an audit verdict (or, with ``order.clear``, lift one)."""
        reply = await self._call(self._tracker().Quarantine, work_wire.quarantine_to_proto(order), timeout_s)
        return work_wire.quarantined_from_proto(reply)

    async def list_quarantine(self, *, timeout_s: float | None = None) -> tuple[QuarantineEntry, ...]:
        """Every quarantined node, with why, since when and the audit's evidence."""
        reply = await self._call(self._tracker().ListQuarantine, services.ListQuarantineRequest(), timeout_s)
        return work_wire.quarantine_list_from_proto(reply)

    async def list_nodes(self, *, timeout_s: float | None = None) -> NodeTable:
        """The tracker's live node table (the SwarmStatus service beside the tracker's own)."""
        stub = self._channel.stub(services.SwarmStatusStub)
        return node_table_from_proto(await self._call(stub.ListNodes, services.ListNodesRequest(), timeout_s))

    # --- artifact directory --------------------------------------------------------------------

    async def advertise(self, advertisement: Advertisement, *, timeout_s: float | None = None) -> float:
        """Announce what a holder holds; the seconds until the next announcement is due."""
        stub = self._channel.stub(services.ArtifactDirectoryStub)
        request = artifact_wire.advertisement_to_proto(advertisement)
        return artifact_wire.advertisement_ack_from_proto(await self._call(stub.Advertise, request, timeout_s))

    async def find_holders(
        self, model_id: str, artifacts: tuple[str, ...] = (), *, timeout_s: float | None = None
    ) -> FoundHolders:
        """Who holds ``artifacts`` (and ``model_id``'s manifests, when named)."""
        stub = self._channel.stub(services.ArtifactDirectoryStub)
        request = artifact_wire.find_to_proto(model_id, artifacts)
        return artifact_wire.found_from_proto(await self._call(stub.FindHolders, request, timeout_s))

    async def _call(self, method: Callable[..., Awaitable[Any]], request: Any, timeout_s: float | None) -> Any:
        try:
            return await method(request, timeout=timeout_s or self._timeout_s)
        except grpc.RpcError as rpc_error:
            raise self._error(rpc_error) from rpc_error

    def _error(self, rpc_error: grpc.RpcError) -> MeshnetError:
        error = error_from_rpc(rpc_error, unreachable=Unreachable)
        return _with_context(error, f"tracker {self.address}: {error.message}")


def _with_context(error: MeshnetError, message: str) -> MeshnetError:
    try:
        return type(error)(message)
    except TypeError:  # a subclass with a richer constructor: keep it as it is
        return error
