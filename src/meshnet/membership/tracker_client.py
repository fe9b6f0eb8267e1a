"""Async client of the tracker: every call a process makes to the tracker's port (or its replicas').

Workers register and heartbeat (``membership.heartbeats``), renew (``membership.join``), follow
revocations (``membership.revocations``) and announce what they hold (``membership.announce``);
the gateway asks ``choose_route`` and files ``report_work``; fetchers ask ``find_holders``;
operators list nodes, quarantine and revoke. All of it goes through one ``RenewingChannel`` per
tracker replica, so after a renewal every call presents the new certificate; with several
replicas the client fails over between them (``membership.replicas``). Every unary call carries a deadline,
and every failure arrives as a typed core error (``meshnet.wire.status``): ``NoRoute`` when the
swarm cannot serve the model, ``Unreachable`` (an ``Unavailable``) when the tracker cannot be reached,
``DeadlineExceeded`` when it is too slow.

Messages are built and read by the ``meshnet.wire`` conversion modules the tracker uses for the
other side of each call; the values exchanged are those of ``meshnet.core``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Protocol, TypeVar

import grpc
import grpc.aio

from meshnet.artifact.directory import Advertisement, FoundHolders
from meshnet.core.audit_evidence import QuarantineEntry
from meshnet.core.errors import DeadlineExceeded, FailedPrecondition, MeshnetError, TrackerBusy, Unreachable
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
from meshnet.membership.beat_streams import (
    DEFAULT_HEARTBEAT_TRANSPORT,
    BeatStreamEnded,
    BeatStreams,
    HeartbeatTransport,
)
from meshnet.membership.channel import RenewingChannel
from meshnet.membership.replicas import (
    RETRIED_ON_NEXT_REPLICA,
    Failure,
    Position,
    ReplicaRing,
    RetryBudget,
    classify,
)
from meshnet.wire import artifact_wire, placement_wire, services, speed_wire, swarm_wire, work_wire
from meshnet.wire import tracker_wire as wire
from meshnet.wire.status import error_from_rpc, status_and_code
from meshnet.wire.status_wire import node_table_from_proto
from meshnet.wire.swarm_wire import IssuedCertificate
from meshnet.wire.tls import TRACKER_NAME, LinkSecurity

logger = logging.getLogger(__name__)

StubT = TypeVar("StubT")


class Attempt(Protocol):
    """One try of a call at a replica, within what is left of its deadline (``_failover``)."""

    async def __call__(self, at: Position, *, deadline: float, wait_for_ready: bool) -> Any: ...


DEFAULT_TIMEOUT_S = 5.0
RECONNECT_BACKOFF_MS = (100, 1000)
"""First and longest wait between attempts to reconnect to the tracker."""
KEEPALIVE_MS = (10_000, 5_000)
"""Ping every 10 s while a call is open, give up 5 s after an unanswered ping: a revocation watch
carries no data for hours and must still notice a tracker that vanished (the tracker's
``SERVER_OPTIONS`` accept these pings)."""

RETRY_FLOOR_S = 0.1
"""Below this much of its deadline left, a call lost with its replica is not asked again: the
next replica could not be dialled and answer in time."""

# gRPC retries a call transparently only under this policy. Only idempotent calls get one:
# ReportWork is keyed by request id, so a retry after a lost reply is stored once. UNAVAILABLE
# here can only be the transport, since the tracker answers UNAVAILABLE only to ChooseRoute.
# With several replicas the client fails over instead (``channel_options``): five attempts at a
# dead replica would spend a second before the next replica is asked.
_RETRY_POLICY = {
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
_BASE_OPTIONS: list[tuple[str, Any]] = [
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


def channel_options(replicas: int) -> list[tuple[str, Any]]:
    """The options of a channel to one of ``replicas`` replicas: gRPC's own retries only when
    there is no other replica to fail over to."""
    if replicas > 1:
        return [("grpc.enable_retries", 0), *_BASE_OPTIONS]
    config = json.dumps({"methodConfig": [_RETRY_POLICY]})
    return [("grpc.service_config", config), ("grpc.enable_retries", 1), *_BASE_OPTIONS]


class TrackerClient:
    """Every call to a tracker, over channels that follow certificate renewal.

    ``address`` is one tracker (``host:port``) or its replicas in order (``a:7070,b:7070``,
    ``membership.replicas``): calls go to the replica that last answered, and a call lost with
    its replica moves the client to the next one, where it is asked once more if that is safe
    (``RETRIED_ON_NEXT_REPLICA``) and the ``budget`` allows, within what is left of the call's
    one deadline. ``InvalidArgument`` for a malformed list; ``FailedPrecondition`` for a call
    after ``close``. Create it inside the event loop that uses it; ``clock`` (monotonic seconds)
    is injected by tests. Heartbeats go on one stream per replica (``membership.beat_streams``)
    unless ``heartbeat_transport`` is "unary"."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        security: LinkSecurity | None = None,
        budget: RetryBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
        heartbeat_transport: HeartbeatTransport = DEFAULT_HEARTBEAT_TRANSPORT,
    ) -> None:
        self.security = security
        self.heartbeat_transport = heartbeat_transport
        """"stream" until a tracker answers ``Beat`` UNIMPLEMENTED (an older one): then "unary" for good."""
        self._beats = BeatStreams()
        self._timeout_s = timeout_s
        self._replicas = ReplicaRing(address)
        self._options = channel_options(len(self._replicas))
        self._budget = budget or RetryBudget()
        self._clock = clock
        self._closed = False
        # One channel per replica, opened when first asked: most clients never leave the first.
        self._channels: dict[int, RenewingChannel] = {}

    @property
    def address(self) -> str:
        """The replica asked now (the one that last answered)."""
        return self._replicas.addresses[self._replicas.current]

    @property
    def addresses(self) -> tuple[str, ...]:
        """Every replica, in the order they are tried."""
        return self._replicas.addresses

    async def __aenter__(self) -> TrackerClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every channel; any later call raises ``FailedPrecondition`` (never reopens one)."""
        self._closed = True
        self._beats.close()
        channels, self._channels = list(self._channels.values()), {}
        await asyncio.gather(*(channel.close() for channel in channels))

    def _channel(self, index: int) -> RenewingChannel:
        if self._closed:
            raise FailedPrecondition(f"tracker client for {','.join(self.addresses)} is closed")
        channel = self._channels.get(index)
        if channel is None:
            address = self._replicas.addresses[index]
            channel = self._channels[index] = RenewingChannel(address, self.security, TRACKER_NAME, self._options)
        return channel

    def _stub(self, index: int, make: Callable[[grpc.aio.Channel], StubT]) -> StubT:
        return self._channel(index).stub(make)

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
        return wire.registered_from_proto(await self._call(services.TrackerStub, "Register", request, timeout_s))

    async def heartbeat(self, node_id: NodeId, load: NodeLoad, *, timeout_s: float | None = None) -> HeartbeatStatus:
        """One heartbeat, on the replica's ``Beat`` stream (or a unary call): failed over as any call."""
        request = wire.heartbeat_to_proto(node_id, load)
        if self.heartbeat_transport == "unary":
            reply = await self._call(services.TrackerStub, "Heartbeat", request, timeout_s)
        else:
            reply = await self._failover("Heartbeat", functools.partial(self._beat_attempt, request), timeout_s)
        return wire.heartbeat_status_from_proto(reply)

    async def deregister(self, node_id: NodeId, *, timeout_s: float | None = None) -> bool:
        reply = await self._call(services.TrackerStub, "Deregister", wire.deregister_to_proto(node_id), timeout_s)
        return wire.deregistered_from_proto(reply).known

    async def suggest_layers(self, question: LayerQuestion, *, timeout_s: float | None = None) -> LayerAdvice:
        """The range the swarm needs most that fits ``question``'s budget (``--layers auto``)."""
        request = placement_wire.question_to_proto(question)
        reply = await self._call(services.TrackerStub, "SuggestLayers", request, timeout_s)
        return placement_wire.advice_from_proto(reply, question.costs.n_layers)

    async def watch_revocations(self) -> AsyncIterator[frozenset[str]]:
        """The swarm's revoked node ids now, then again after every change (no deadline: it
        runs until the caller stops iterating or the tracker ends it). ``membership.revocations``
        keeps one open for a process."""
        at = self._replicas.position()
        call = self._stub(at.index, services.TrackerStub).WatchRevocations(wire.watch_revocations_to_proto())
        try:
            async for message in call:
                yield wire.revocations_from_proto(message)
        except grpc.RpcError as rpc_error:
            error, failure = self._error(rpc_error, at.index)
            self._failed(at, failure, error)  # when gone, the caller's next watch opens on the next replica
            raise error from rpc_error
        finally:
            call.cancel()

    # --- certificates (the Swarm service on the same port) -----------------------------------

    async def renew(self, csr_pem: bytes, *, timeout_s: float | None = None) -> IssuedCertificate:
        """A certificate for ``csr_pem``'s key, with this client's node id and role."""
        return swarm_wire.issued_from_proto(
            await self._call(services.SwarmStub, "Renew", swarm_wire.renew_to_proto(csr_pem), timeout_s)
        )

    async def revoke(self, node_id: str, *, timeout_s: float | None = None) -> tuple[bool, bool]:
        """(newly revoked, was routed)."""
        reply = await self._call(services.SwarmStub, "Revoke", swarm_wire.revoke_to_proto(node_id), timeout_s)
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
        return wire.route_from_proto(await self._call(services.TrackerStub, "ChooseRoute", request, timeout_s))

    async def report_work(self, record: WorkRecord, *, timeout_s: float | None = None) -> WorkAck:
        """Store ``record``; safe to repeat (idempotent by request id) until it is acknowledged."""
        reply = await self._call(services.TrackerStub, "ReportWork", work_wire.work_to_proto(record), timeout_s)
        return work_wire.work_ack_from_proto(reply)

    async def report_session_tokens(
        self, node_id: NodeId, sessions: tuple[SessionTokens, ...], *, timeout_s: float | None = None
    ) -> int:
        """Tell the tracker what this worker computed for sessions that ended; returns how many it counted."""
        request = work_wire.session_tokens_to_proto(node_id, sessions)
        reply = await self._call(services.TrackerStub, "ReportSessionTokens", request, timeout_s)
        return work_wire.session_tokens_ack_from_proto(reply)

    async def report_route_timing(self, timing: RouteTiming, *, timeout_s: float | None = None) -> bool:
        """Tell the tracker how fast a route served; True: taken into its measure of node speeds."""
        reply = await self._call(
            services.TrackerStub, "ReportRouteTiming", speed_wire.timing_to_proto(timing), timeout_s
        )
        return speed_wire.timing_ack_from_proto(reply)

    async def list_models(self, *, timeout_s: float | None = None) -> tuple[ModelSummary, ...]:
        reply = await self._call(services.TrackerStub, "ListModels", wire.list_models_request_to_proto(), timeout_s)
        models, _epoch = wire.models_from_proto(reply)
        return models

    async def quarantine(self, order: QuarantineOrder, *, timeout_s: float | None = None) -> Quarantined:
        """Report an audit verdict (or, with ``order.clear``, lift one)."""
        reply = await self._call(services.TrackerStub, "Quarantine", work_wire.quarantine_to_proto(order), timeout_s)
        return work_wire.quarantined_from_proto(reply)

    async def list_quarantine(self, *, timeout_s: float | None = None) -> tuple[QuarantineEntry, ...]:
        """Every quarantined node, with why, since when and the audit's evidence."""
        reply = await self._call(services.TrackerStub, "ListQuarantine", services.ListQuarantineRequest(), timeout_s)
        return work_wire.quarantine_list_from_proto(reply)

    async def list_nodes(self, *, timeout_s: float | None = None) -> NodeTable:
        """The tracker's live node table (the SwarmStatus service beside the tracker's own)."""
        return node_table_from_proto(
            await self._call(services.SwarmStatusStub, "ListNodes", services.ListNodesRequest(), timeout_s)
        )

    # --- artifact directory --------------------------------------------------------------------

    async def advertise(self, advertisement: Advertisement, *, timeout_s: float | None = None) -> float:
        """Announce what a holder holds; the seconds until the next announcement is due."""
        request = artifact_wire.advertisement_to_proto(advertisement)
        return artifact_wire.advertisement_ack_from_proto(
            await self._call(services.ArtifactDirectoryStub, "Advertise", request, timeout_s)
        )

    async def find_holders(
        self, model_id: str, artifacts: tuple[str, ...] = (), *, timeout_s: float | None = None
    ) -> FoundHolders:
        """Who holds ``artifacts`` (and ``model_id``'s manifests, when named)."""
        request = artifact_wire.find_to_proto(model_id, artifacts)
        return artifact_wire.found_from_proto(
            await self._call(services.ArtifactDirectoryStub, "FindHolders", request, timeout_s)
        )

    async def _call(
        self, make: Callable[[grpc.aio.Channel], Any], method: str, request: Any, timeout_s: float | None
    ) -> Any:
        """``method`` of the stub ``make`` builds, on the replica asked now; once more on the
        next replica when the first is gone, the call is safe to repeat, the retry budget has
        one and enough of the call's one deadline is left."""
        return await self._failover(
            method, functools.partial(self._attempt, make=make, method=method, request=request), timeout_s
        )

    async def _failover(self, method: str, attempt: Attempt, timeout_s: float | None) -> Any:
        """``attempt`` at the replica asked now, then as ``_call`` says at the next one."""
        deadline = self._clock() + (timeout_s or self._timeout_s)
        self._budget.earn()
        at = self._replicas.position()
        try:
            return await attempt(at, deadline=deadline, wait_for_ready=False)
        except _Failed as failed:
            moved = self._failed(at, failed.failure, failed.error) or self._replicas.elsewhere(at)
            if not (moved and self._may_retry(method, failed.failure, deadline)):
                raise failed.error from failed.__cause__
        following = self._replicas.position()
        try:
            return await attempt(following, deadline=deadline, wait_for_ready=True)
        except _Failed as failed:
            self._failed(following, failed.failure, failed.error)
            raise failed.error from failed.__cause__

    def _may_retry(self, method: str, failure: Failure, deadline: float) -> bool:
        return (
            failure is Failure.GONE
            and method in RETRIED_ON_NEXT_REPLICA
            and deadline - self._clock() >= RETRY_FLOOR_S
            and self._budget.spend()
        )

    async def _attempt(
        self,
        at: Position,
        *,
        make: Callable[[grpc.aio.Channel], Any],
        method: str,
        request: Any,
        deadline: float,
        wait_for_ready: bool,
    ) -> Any:
        """One try at ``at``, within what is left of ``deadline``. A retry waits for its channel
        to connect (TCP and TLS to a replica not asked before) inside that time rather than
        failing at once on a channel still connecting."""
        channel = self._channel(at.index)
        call = getattr(channel.stub(make), method)
        try:
            reply = await call(request, timeout=max(deadline - self._clock(), 0.0), wait_for_ready=wait_for_ready)
        except grpc.RpcError as rpc_error:
            error, failure = self._error(rpc_error, at.index)
            raise _Failed(error, _unreached(failure, channel, wait_for_ready)) from rpc_error
        self._replicas.answered(at)
        return reply

    async def _beat_attempt(
        self, request: services.NodeHeartbeat, at: Position, *, deadline: float, wait_for_ready: bool
    ) -> services.HeartbeatReply:
        """One heartbeat on replica ``at``'s stream; an older tracker's UNIMPLEMENTED turns this
        client to unary heartbeats for good (this beat too). A broken stream is a failed beat."""
        channel = self._channel(at.index)
        address = self._replicas.addresses[at.index]
        try:
            timeout_s = max(deadline - self._clock(), 0.0)
            reply = await self._beats.beat(
                channel.channel(), at.index, request, timeout_s, wait_for_ready=wait_for_ready
            )
        except grpc.RpcError as rpc_error:
            if self._maybe_without_streams(rpc_error):
                # This beat as a unary call; only if that one is answered is the tracker an older one.
                reply = await self._attempt(
                    at,
                    make=services.TrackerStub,
                    method="Heartbeat",
                    request=request,
                    deadline=deadline,
                    wait_for_ready=wait_for_ready,
                )
                logger.info("tracker %s has no heartbeat stream: heartbeating with unary calls", address)
                self.heartbeat_transport = "unary"
                return reply
            error, failure = self._error(rpc_error, at.index)
            raise _Failed(error, _unreached(failure, channel, wait_for_ready)) from rpc_error
        except TimeoutError as late:
            failure = _unreached(Failure.SLOW, channel, wait_for_ready)
            raise _Failed(DeadlineExceeded(f"tracker {address}: no heartbeat reply in time"), failure) from late
        except BeatStreamEnded as ended:
            raise _Failed(Unreachable(f"tracker {address}: {ended}"), Failure.GONE) from ended
        self._replicas.answered(at)
        return reply

    def _failed(self, at: Position, failure: Failure, error: MeshnetError) -> bool:
        """Note a failed call at ``at``; True when the client moved on (then the next replica's
        channel starts connecting now, before anything is asked of it)."""
        if not self._replicas.failed(at, failure):
            return False
        logger.warning(
            "tracker %s %s (%s); moving to %s",
            self._replicas.addresses[at.index],
            "lost" if failure is Failure.GONE else "too slow",
            error.message,
            self.address,
        )
        if not self._closed:
            self._channel(self._replicas.current).channel().get_state(try_to_connect=True)
        return True

    def _error(self, rpc_error: grpc.RpcError, index: int) -> tuple[MeshnetError, Failure]:
        """The typed error ``rpc_error`` stands for, and what it says about replica ``index``."""
        error = error_from_rpc(rpc_error, unreachable=Unreachable)
        failure = classify(*status_and_code(rpc_error), error)
        return _with_context(error, f"tracker {self._replicas.addresses[index]}: {error.message}"), failure

    def _maybe_without_streams(self, rpc_error: grpc.RpcError) -> bool:
        """Whether a failed stream says the tracker may not serve ``Beat``: UNIMPLEMENTED, or
        INTERNAL before any stream of this client was ever answered. grpc's asyncio client reports
        a write racing the server's end of the stream as INTERNAL, losing the server's status
        (grpc/grpc#36066): an older tracker's UNIMPLEMENTED arrives so about half of the time."""
        code = rpc_error.code()
        return code == grpc.StatusCode.UNIMPLEMENTED or (code == grpc.StatusCode.INTERNAL and not self._beats.answered)


def _unreached(failure: Failure, channel: RenewingChannel, wait_for_ready: bool) -> Failure:
    """A retry that ran out of time never having reached its replica found it gone, not slow."""
    if failure is Failure.SLOW and wait_for_ready and channel.channel().get_state() != grpc.ChannelConnectivity.READY:
        return Failure.GONE
    return failure


class _Failed(Exception):
    """One attempt's failure, judged (never leaves this module)."""

    def __init__(self, error: MeshnetError, failure: Failure) -> None:
        super().__init__(error.message)
        self.error, self.failure = error, failure


def _with_context(error: MeshnetError, message: str) -> MeshnetError:
    if isinstance(error, TrackerBusy):  # keep the tracker's retry hint
        return TrackerBusy(message, error.retry_after_s)
    try:
        return type(error)(message)
    except TypeError:  # a subclass with a richer constructor: keep it as it is
        return error
