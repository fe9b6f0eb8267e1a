"""Async client of the tracker: every call a process makes to the tracker's port (or its replicas').

Workers register and heartbeat (``membership.heartbeats``), renew (``membership.join``), follow
revocations (``membership.revocations``) and announce what they hold (``membership.announce``);
the gateway asks ``choose_route`` and files ``report_work``; fetchers ask ``find_holders``;
operators list nodes, quarantine and revoke. All of it goes through one ``RenewingChannel`` per
tracker replica, so after a renewal every call presents the new certificate; with several
replicas the client fails over between them (``membership.tracker_failover`` carries out what
``membership.replicas`` decides). Every unary call carries a deadline,
and every failure arrives as a typed core error (``meshnet.wire.status``): ``NoRoute`` when the
swarm cannot serve the model, ``Unreachable`` (an ``Unavailable``) when the tracker cannot be reached,
``DeadlineExceeded`` when it is too slow.

Messages are built and read by the ``meshnet.wire`` conversion modules the tracker uses for the
other side of each call; the values exchanged are those of ``meshnet.core``.
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable

import grpc

from meshnet.artifact.directory import Advertisement, FoundHolders
from meshnet.core.addresses import TrackerOrder
from meshnet.core.audit_evidence import QuarantineEntry
from meshnet.core.errors import DeadlineExceeded, MeshnetError, Unreachable
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layer_costs import LayerAdvice, LayerQuestion
from meshnet.core.node_record import NodeRecord
from meshnet.core.reachability import DeclaredReachability
from meshnet.core.swarm_status import NodeTable
from meshnet.core.tracking import (
    DEFAULT_HEARTBEAT_TRANSPORT,
    HeartbeatStatus,
    HeartbeatTransport,
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
from meshnet.membership.beat_streams import BeatStreamEnded, BeatStreams
from meshnet.membership.replicas import Failure, Position, RetryBudget
from meshnet.membership.tracker_failover import DEFAULT_TIMEOUT_S, AttemptFailed, TrackerFailover, unreached
from meshnet.wire import artifact_wire, placement_wire, services, speed_wire, swarm_wire, work_wire
from meshnet.wire import tracker_wire as wire
from meshnet.wire.status_wire import node_table_from_proto
from meshnet.wire.swarm_wire import IssuedCertificate
from meshnet.wire.tls import LinkSecurity

logger = logging.getLogger(__name__)


class TrackerClient:
    """Every call to a tracker, over channels that follow certificate renewal.

    ``address`` is one tracker (``host:port``) or its replicas (``a:7070,b:7070``): every call
    crosses them as ``membership.tracker_failover`` says (the replica that last answered, the
    next one when it is lost, ``budget`` for retries within the call's one deadline); this class
    builds each call's request and reads its reply. The replicas are asked in an order of this
    client's own (``membership.replicas.replica_order``) so a swarm's clients spread over them:
    ranked by ``replica_key`` (a worker passes its node id), else by its certificate's node id,
    else by a random draw; ``order`` "listed" pins the listed order instead (first listed
    first). ``InvalidArgument`` for a malformed list; ``FailedPrecondition`` for a call after
    ``close``. Create it inside the event loop that uses it; ``clock`` (monotonic seconds) is
    injected by tests. Heartbeats go on one stream per replica (``membership.beat_streams``)
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
        replica_key: str | None = None,
        order: TrackerOrder = "spread",
    ) -> None:
        self.security = security
        self.heartbeat_transport = heartbeat_transport
        """"stream" until a tracker answers ``Beat`` UNIMPLEMENTED (an older one): then "unary" for good."""
        self._beats = BeatStreams()
        key = None if order == "listed" else replica_key or _own_key(security)
        self._calls = TrackerFailover(
            address, timeout_s=timeout_s, security=security, budget=budget, clock=clock, client_key=key
        )

    @property
    def address(self) -> str:
        """The replica asked now (the one that last answered)."""
        return self._calls.address

    @property
    def addresses(self) -> tuple[str, ...]:
        """Every replica, as listed."""
        return self._calls.addresses

    @property
    def order(self) -> tuple[str, ...]:
        """Every replica, in the order this client tries them."""
        return self._calls.order

    async def __aenter__(self) -> TrackerClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every channel; any later call raises ``FailedPrecondition`` (never reopens one)."""
        self._beats.close()
        await self._calls.close()

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
        return wire.registered_from_proto(await self._calls.call(services.TrackerStub, "Register", request, timeout_s))

    async def heartbeat(self, node_id: NodeId, load: NodeLoad, *, timeout_s: float | None = None) -> HeartbeatStatus:
        """One heartbeat, on the replica's ``Beat`` stream (or a unary call): failed over as any call."""
        request = wire.heartbeat_to_proto(node_id, load)
        if self.heartbeat_transport == "unary":
            reply = await self._calls.call(services.TrackerStub, "Heartbeat", request, timeout_s)
        else:
            reply = await self._calls.failover("Heartbeat", functools.partial(self._beat_attempt, request), timeout_s)
        return wire.heartbeat_status_from_proto(reply)

    async def deregister(self, node_id: NodeId, *, timeout_s: float | None = None) -> bool:
        reply = await self._calls.call(services.TrackerStub, "Deregister", wire.deregister_to_proto(node_id), timeout_s)
        return wire.deregistered_from_proto(reply).known

    async def suggest_layers(self, question: LayerQuestion, *, timeout_s: float | None = None) -> LayerAdvice:
        """The range the swarm needs most that fits ``question``'s budget (``--layers auto``)."""
        request = placement_wire.question_to_proto(question)
        reply = await self._calls.call(services.TrackerStub, "SuggestLayers", request, timeout_s)
        return placement_wire.advice_from_proto(reply, question.costs.n_layers)

    async def watch_revocations(self) -> AsyncIterator[frozenset[str]]:
        """The swarm's revoked node ids now, then again after every change (no deadline: it
        runs until the caller stops iterating or the tracker ends it). ``membership.revocations``
        keeps one open for a process."""
        at = self._calls.position()
        call = self._calls.stub(at.index, services.TrackerStub).WatchRevocations(wire.watch_revocations_to_proto())
        try:
            async for message in call:
                yield wire.revocations_from_proto(message)
        except grpc.RpcError as rpc_error:
            error, failure = self._calls.error(rpc_error, at.index)
            self._calls.failed(at, failure, error)  # when gone, the caller's next watch opens on the next replica
            raise error from rpc_error
        finally:
            call.cancel()

    # --- certificates (the Swarm service on the same port) -----------------------------------

    async def renew(self, csr_pem: bytes, *, timeout_s: float | None = None) -> IssuedCertificate:
        """A certificate for ``csr_pem``'s key, with this client's node id and role."""
        return swarm_wire.issued_from_proto(
            await self._calls.call(services.SwarmStub, "Renew", swarm_wire.renew_to_proto(csr_pem), timeout_s)
        )

    async def revoke(self, node_id: str, *, timeout_s: float | None = None) -> tuple[bool, bool]:
        """(newly revoked, was routed)."""
        reply = await self._calls.call(services.SwarmStub, "Revoke", swarm_wire.revoke_to_proto(node_id), timeout_s)
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
        return wire.route_from_proto(await self._calls.call(services.TrackerStub, "ChooseRoute", request, timeout_s))

    async def report_work(self, record: WorkRecord, *, timeout_s: float | None = None) -> WorkAck:
        """Store ``record``; safe to repeat (idempotent by request id) until it is acknowledged."""
        reply = await self._calls.call(services.TrackerStub, "ReportWork", work_wire.work_to_proto(record), timeout_s)
        return work_wire.work_ack_from_proto(reply)

    async def report_session_tokens(
        self, node_id: NodeId, sessions: tuple[SessionTokens, ...], *, timeout_s: float | None = None
    ) -> int:
        """Tell the tracker what this worker computed for sessions that ended; returns how many it counted."""
        request = work_wire.session_tokens_to_proto(node_id, sessions)
        reply = await self._calls.call(services.TrackerStub, "ReportSessionTokens", request, timeout_s)
        return work_wire.session_tokens_ack_from_proto(reply)

    async def report_route_timing(self, timing: RouteTiming, *, timeout_s: float | None = None) -> bool:
        """Tell the tracker how fast a route served; True: taken into its measure of node speeds."""
        reply = await self._calls.call(
            services.TrackerStub, "ReportRouteTiming", speed_wire.timing_to_proto(timing), timeout_s
        )
        return speed_wire.timing_ack_from_proto(reply)

    async def list_models(self, *, timeout_s: float | None = None) -> tuple[ModelSummary, ...]:
        reply = await self._calls.call(
            services.TrackerStub, "ListModels", wire.list_models_request_to_proto(), timeout_s
        )
        models, _epoch = wire.models_from_proto(reply)
        return models

    async def quarantine(self, order: QuarantineOrder, *, timeout_s: float | None = None) -> Quarantined:
        """Report an audit verdict (or, with ``order.clear``, lift one)."""
        reply = await self._calls.call(
            services.TrackerStub, "Quarantine", work_wire.quarantine_to_proto(order), timeout_s
        )
        return work_wire.quarantined_from_proto(reply)

    async def list_quarantine(self, *, timeout_s: float | None = None) -> tuple[QuarantineEntry, ...]:
        """Every quarantined node, with why, since when and the audit's evidence."""
        reply = await self._calls.call(
            services.TrackerStub, "ListQuarantine", services.ListQuarantineRequest(), timeout_s
        )
        return work_wire.quarantine_list_from_proto(reply)

    async def list_nodes(self, *, timeout_s: float | None = None) -> NodeTable:
        """The tracker's live node table (the SwarmStatus service beside the tracker's own)."""
        return node_table_from_proto(
            await self._calls.call(services.SwarmStatusStub, "ListNodes", services.ListNodesRequest(), timeout_s)
        )

    # --- artifact directory --------------------------------------------------------------------

    async def advertise(self, advertisement: Advertisement, *, timeout_s: float | None = None) -> float:
        """Announce what a holder holds; the seconds until the next announcement is due."""
        request = artifact_wire.advertisement_to_proto(advertisement)
        return artifact_wire.advertisement_ack_from_proto(
            await self._calls.call(services.ArtifactDirectoryStub, "Advertise", request, timeout_s)
        )

    async def find_holders(
        self, model_id: str, artifacts: tuple[str, ...] = (), *, timeout_s: float | None = None
    ) -> FoundHolders:
        """Who holds ``artifacts`` (and ``model_id``'s manifests, when named)."""
        request = artifact_wire.find_to_proto(model_id, artifacts)
        return artifact_wire.found_from_proto(
            await self._calls.call(services.ArtifactDirectoryStub, "FindHolders", request, timeout_s)
        )

    async def _beat_attempt(
        self, request: services.NodeHeartbeat, at: Position, *, deadline: float, wait_for_ready: bool
    ) -> services.HeartbeatReply:
        """One heartbeat on replica ``at``'s stream; an older tracker's UNIMPLEMENTED turns this
        client to unary heartbeats for good (this beat too). A broken stream is a failed beat."""
        channel = self._calls.channel(at.index)
        address = self._calls.addresses[at.index]
        try:
            timeout_s = self._calls.remaining(deadline)
            reply = await self._beats.beat(
                channel.channel(), at.index, request, timeout_s, wait_for_ready=wait_for_ready
            )
        except grpc.RpcError as rpc_error:
            if self._maybe_without_streams(rpc_error):
                # This beat as a unary call; only if that one is answered is the tracker an older one.
                reply = await self._calls.attempt(
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
            error, failure = self._calls.error(rpc_error, at.index)
            raise AttemptFailed(error, unreached(failure, channel, wait_for_ready)) from rpc_error
        except TimeoutError as late:
            failure = unreached(Failure.SLOW, channel, wait_for_ready)
            raise AttemptFailed(DeadlineExceeded(f"tracker {address}: no heartbeat reply in time"), failure) from late
        except BeatStreamEnded as ended:
            raise AttemptFailed(Unreachable(f"tracker {address}: {ended}"), Failure.GONE) from ended
        self._calls.answered(at)
        return reply

    def _maybe_without_streams(self, rpc_error: grpc.RpcError) -> bool:
        """Whether a failed stream says the tracker may not serve ``Beat``: UNIMPLEMENTED, or
        INTERNAL before any stream of this client was ever answered. grpc's asyncio client reports
        a write racing the server's end of the stream as INTERNAL, losing the server's status
        (grpc/grpc#36066): an older tracker's UNIMPLEMENTED arrives so about half of the time."""
        code = rpc_error.code()
        return code == grpc.StatusCode.UNIMPLEMENTED or (code == grpc.StatusCode.INTERNAL and not self._beats.answered)


def _own_key(security: LinkSecurity | None) -> str:
    """What ranks the replicas for a client given no key: its certificate's node id (stable
    across restarts), else a random draw (clients without one spread all the same)."""
    if security is not None:
        try:
            return security.identity.node_id
        except MeshnetError:  # an expired certificate: its calls will say so, not its construction
            pass
    return secrets.token_hex(8)
