"""The gRPC servicer: decode, call the registry or the store, persist the epoch, encode.

It holds no logic of its own (route choice is ``routing``, liveness is ``registry``,
durability is ``store`` reached through ``store_runner``; admission, counting and error mapping
are ``call_guards``). Typed errors leave through ``meshnet.wire.status``, which adds
the error's ``code`` as trailing metadata: that is how a client tells "no route" (UNAVAILABLE
from us, code ``no_route``) from "tracker unreachable" (UNAVAILABLE from the transport).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from meshnet.core.errors import (
    MeshnetError,
    PermissionDenied,
    StorageUnavailable,
    TrackerBusy,
    Unauthenticated,
    Uncertified,
)
from meshnet.core.ids import NodeId
from meshnet.core.node_record import NodeRecord
from meshnet.core.tracking import (
    Deregistered,
    HeartbeatStatus,
    NodeLoad,
    Quarantined,
    Registered,
    RouteQuery,
    WorkAck,
)
from meshnet.security.identity import PeerIdentity
from meshnet.security.policy import authorize_tracker
from meshnet.security.tickets import TicketSigner
from meshnet.tracker.admission import Admission, CallClass
from meshnet.tracker.call_guards import admit_call, admitted, counted, maps_errors
from meshnet.tracker.checked_work import CheckedWork
from meshnet.tracker.dial_back import AddressProof
from meshnet.tracker.liveness import Sleep, watch_loop
from meshnet.tracker.metrics import ServedCalls
from meshnet.tracker.node_entry import Clock
from meshnet.tracker.placement import served_spans, suggest_layers
from meshnet.tracker.quarantine import check_quarantine_order
from meshnet.tracker.registry import NodeRegistry
from meshnet.tracker.revocation_feed import RevocationFeed
from meshnet.tracker.store_runner import DurableEpoch, StoreRunner
from meshnet.tracker.tickets import TicketIssuer
from meshnet.wire import placement_wire, services, speed_wire, work_wire
from meshnet.wire import tracker_wire as wire
from meshnet.wire.status import abort_with
from meshnet.wire.tls import LinkSecurity, enforce

logger = logging.getLogger(__name__)


class TrackerServicer(services.TrackerServicer):
    def __init__(
        self,
        registry: NodeRegistry,
        store: StoreRunner,
        wall_clock: Clock,
        security: LinkSecurity | None = None,
        revocations: RevocationFeed | None = None,
        work: CheckedWork | None = None,
        admission: Admission | None = None,
    ) -> None:
        self._registry = registry
        self.served = ServedCalls()
        """Heartbeats and registrations this replica answered (``tracker.metrics``)."""
        self.admission = admission or registry.admission
        """Sheds the least important calls while the tracker is behind (``tracker.admission``)."""
        self.work = work
        """Judges work records against routes and shards' counts (secured trackers: on a plaintext
        one every caller may claim any identity, so there is nothing to hold a record to)."""
        self._security = security
        """None only on a loopback development tracker (``--insecure``): then nobody is checked."""
        self.revocations = revocations or RevocationFeed(None if security is None else security.revocations)
        self._store = store
        self._wall_clock = wall_clock
        self._tickets = TicketIssuer(None if security is None else TicketSigner(lambda: security.node), wall_clock)
        self._addresses = AddressProof(security)
        self._epoch = DurableEpoch(store, lambda: registry.epoch, registry.epoch)

    async def persist_epoch(self) -> None:
        """Make the registry's epoch durable before any reply that carries it goes out."""
        await self._epoch.persist()

    def admit(
        self, context: grpc.aio.ServicerContext, rpc: str, subject: str | None = None, *, shed: CallClass = "live"
    ) -> PeerIdentity | None:
        """The caller, if ``rpc`` is allowed to it (raises Unauthenticated / PermissionDenied);
        then, the caller known, raises ``TrackerBusy`` if a ``shed`` call is shed now."""
        peer = admit_call(self._security, context, rpc, subject)
        if shed != "live":
            self.admission.check(shed)
        return peer

    @maps_errors
    @counted
    async def Register(
        self, request: services.NodeRegistration, context: grpc.aio.ServicerContext
    ) -> services.RegisterReply:
        record, node_id = wire.registration_from_proto(request)
        known_epoch = wire.known_epoch_from_proto(request)
        declared = wire.declared_from_proto(request)
        # Secured, the id must be the certificate's (``authorize_tracker``): one node, one id.
        self.admit(context, "Register", node_id, shed="registration")
        self._registry.check_admissible(node_id)
        # Routable only if the address is the node's: it answers there under that id
        # (``dial_back``); else it is private, and a private claim evicts no node serving there.
        reachability = await self._addresses.reachability(record.address, node_id, declared)
        try:
            self._registry.register(record, node_id, reachability, pending=True)
        except Uncertified as refused:
            await self.persist_epoch()  # a stale entry at its address may have left routes
            logger.warning("%s", refused.message)
            raise
        try:
            await self._record_registration(node_id, record, known_epoch)
        finally:
            # Its window starts when it is told it is registered (or the handler failed): until
            # then a slow store cannot expire it (``NodeRegistry.register``'s ``pending``).
            heard = self._registry.heard(node_id)
        if not heard:  # replaced (or deregistered) while its registration was being written
            raise TrackerBusy(f"node {node_id} was replaced while it registered; register again")
        self.served.registrations += 1
        logger.info(
            "node %s registered %s: %s layers %s of %s (certification %s)",
            node_id,
            reachability,
            record.address,
            record.layers,
            record.fingerprint,
            record.certification.digest[:16],
        )
        registered = Registered(node_id, self._registry.heartbeat_interval_s, self._registry.epoch, reachability)
        return wire.registered_to_proto(registered)

    async def _record_registration(self, node_id: NodeId, record: NodeRecord, known_epoch: int) -> None:
        """The durable part of a registration: the table of nodes seen, then the epoch."""
        self._registry.adopt_epoch(known_epoch)  # after a restart without our state: above the node's
        try:
            await self._store.call(self._store.store.record_node, node_id, record, self._wall_clock())
        except StorageUnavailable as error:
            # The table of nodes seen is history, not what routes read: a full disk must not
            # keep a node out. The epoch below is what must be durable before the reply.
            logger.warning("node %s registered but not recorded: %s", node_id, error.message)
        await self.persist_epoch()

    @maps_errors
    @admitted("live")
    async def Heartbeat(
        self, request: services.NodeHeartbeat, context: grpc.aio.ServicerContext
    ) -> services.HeartbeatReply:
        node_id, load = wire.heartbeat_from_proto(request)
        self.admit(context, "Heartbeat", node_id)
        return wire.heartbeat_status_to_proto(await self._beat(node_id, load))

    async def Beat(
        self, requests: AsyncIterator[services.NodeHeartbeat], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[services.HeartbeatReply]:
        """Heartbeats on one stream, each answered as ``Heartbeat`` answers it. The certificate is
        read once, when the first message fixes the stream's node id; revocation is checked on
        every beat. Idle, the stream is not a call in flight (``admission``): only a beat is."""
        try:
            stream: tuple[NodeId, PeerIdentity | None] | None = None
            async for request in requests:
                node_id, load = wire.heartbeat_from_proto(request)
                if stream is None:
                    stream = (node_id, self.admit(context, "Heartbeat", node_id))
                self._check_stream_beat(stream, node_id)
                with self.admission.handling("live"):
                    status = await self._beat(node_id, load)
                yield wire.heartbeat_status_to_proto(status)
        except MeshnetError as error:
            await abort_with(context, error)

    def _check_stream_beat(self, stream: tuple[NodeId, PeerIdentity | None], node_id: NodeId) -> None:
        """A stream speaks for the one node its first beat named, while that node is not revoked."""
        stream_id, peer = stream
        if node_id != stream_id:
            raise PermissionDenied(f"a heartbeat stream of node {stream_id} may not beat for node {node_id}")
        if peer is not None and self._security is not None:
            enforce(
                authorize_tracker(
                    peer, "Heartbeat", subject_node_id=node_id, revoked=self._security.revocations.current()
                )
            )

    async def _beat(self, node_id: NodeId, load: NodeLoad) -> HeartbeatStatus:
        """One heartbeat of an admitted caller, however it came (``Heartbeat`` or ``Beat``)."""
        # The load report is O(1) to take and its routed count must reset (free sessions would
        # drift below zero): a busy tracker sheds only the probe list, never the heartbeat.
        known = self._registry.heartbeat(node_id, load)
        if not known:  # expired, or this tracker restarted: the node registers again at once
            logger.info("heartbeat from node %s, which is not registered", node_id)
        await self.persist_epoch()
        if known:
            # The node sends its next heartbeat after this reply: a reply that waited on the store
            # (the epoch moved, the store is behind) must not eat into its window.
            self._registry.heard(node_id)
        probing = known and not self.admission.sheds("probe")
        probe = self._registry.probe_targets(node_id) if probing else ()
        self.served.heartbeats += 1
        return HeartbeatStatus(known, self._registry.epoch, probe)

    async def WatchRevocations(
        self, request: services.WatchRevocationsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[services.RevocationList]:
        """The whole list now and after every change; a watcher revoked itself is ended."""
        try:
            peer = self.admit(context, "WatchRevocations")
            async for revoked in self.revocations.updates():
                if peer is not None and peer.node_id in revoked:
                    raise Unauthenticated(f"node {peer.node_id} is revoked")
                yield wire.revocations_to_proto(revoked)
        except MeshnetError as error:
            await abort_with(context, error)

    @maps_errors
    async def ChooseRoute(
        self, request: services.RouteRequest, context: grpc.aio.ServicerContext
    ) -> services.RouteReply:
        query = wire.route_query_from_proto(request)
        with self.admission.counting():
            caller = self.admit(context, "ChooseRoute", shed=self._route_call(query))
            route = self._registry.choose_route(query)
            await self.persist_epoch()
            if self.work is not None and not query.unbilled:
                self.work.routed(query, route, None if caller is None else caller.node_id)
            # Its ticket is given to the caller: only it may open the route's head session.
            route = self._tickets.issue(route, query, None if caller is None else caller.node_id)
            return wire.route_to_proto(route)

    def _route_call(self, query: RouteQuery) -> CallClass:
        """A probe has no session; a live session's route is never shed; a new session's is last."""
        if query.session_id is None:
            return "probe"
        return "live" if self._registry.holds_session(query.session_id) else "new_session"

    @maps_errors
    @admitted("live")
    async def ReportWork(self, request: services.WorkRecord, context: grpc.aio.ServicerContext) -> services.WorkAck:
        record = work_wire.work_from_proto(request)
        peer = self.admit(context, "ReportWork")
        if self.work is not None:
            ack = await self.work.report(record, None if peer is None else peer.node_id)
            return work_wire.work_ack_to_proto(ack)
        stored = await self._store.call(self._store.store.record_work, record, self._wall_clock())
        return work_wire.work_ack_to_proto(WorkAck(record.request_id, duplicate=not stored))

    @maps_errors
    @admitted("live")
    async def ReportSessionTokens(
        self, request: services.SessionTokensReport, context: grpc.aio.ServicerContext
    ) -> services.SessionTokensAck:
        node_id, sessions = work_wire.session_tokens_from_proto(request)
        self.admit(context, "ReportSessionTokens", node_id)
        counted = 0 if self.work is None else await self.work.counted(node_id, sessions)
        return work_wire.session_tokens_ack_to_proto(counted)

    @maps_errors
    @counted
    async def ReportRouteTiming(
        self, request: services.RouteTiming, context: grpc.aio.ServicerContext
    ) -> services.RouteTimingAck:
        timing = speed_wire.timing_from_proto(request)
        self.admit(context, "ReportRouteTiming", shed="probe")
        return speed_wire.timing_ack_to_proto(self._registry.observe_route(timing))

    @maps_errors
    @counted
    async def ListModels(
        self, request: services.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> services.ModelList:
        self.admit(context, "ListModels", shed="probe")
        models = self._registry.list_models()
        await self.persist_epoch()
        return wire.models_to_proto(models, self._registry.epoch)

    @maps_errors
    @admitted("live")
    async def Deregister(
        self, request: services.DeregisterRequest, context: grpc.aio.ServicerContext
    ) -> services.DeregisterReply:
        node_id = wire.deregister_from_proto(request)
        self.admit(context, "Deregister", node_id)
        known = self._registry.deregister(node_id)
        await self.persist_epoch()
        return wire.deregistered_to_proto(Deregistered(known, self._registry.epoch))

    @maps_errors
    @admitted("live")
    async def Quarantine(
        self, request: services.QuarantineRequest, context: grpc.aio.ServicerContext
    ) -> services.QuarantineReply:
        order = work_wire.quarantine_from_proto(request)
        peer = self.admit(context, "ClearQuarantine" if order.clear else "Quarantine")
        if not order.clear:
            check_quarantine_order(peer, order)
        store = self._store.store
        if order.clear:
            known = self._registry.clear_quarantine(order.node_id)
            await self._store.call(store.clear_quarantine, order.node_id)
            logger.warning("node %s: quarantine cleared", order.node_id)
            return work_wire.quarantined_to_proto(Quarantined(known, False, self._registry.epoch))
        # Durable first: a tracker restart must not let the node back in.
        marked = await self._store.call(
            store.quarantine_node, order.node_id, order.reason, order.request_id, self._wall_clock(), order.evidence
        )
        known = self._registry.quarantine(order.node_id)
        await self.persist_epoch()
        logger.warning("node %s quarantined: %s", order.node_id, order.reason)
        return work_wire.quarantined_to_proto(Quarantined(known, marked, self._registry.epoch))

    @maps_errors
    @counted
    async def ListQuarantine(
        self, request: services.ListQuarantineRequest, context: grpc.aio.ServicerContext
    ) -> services.QuarantineList:
        self.admit(context, "ListQuarantine", shed="probe")
        entries = await self._store.call(self._store.store.quarantine_entries)
        return work_wire.quarantine_list_to_proto(entries)

    @maps_errors
    @counted
    async def SuggestLayers(
        self, request: services.LayerSuggestionRequest, context: grpc.aio.ServicerContext
    ) -> services.LayerSuggestionReply:
        self.admit(context, "SuggestLayers", shed="probe")
        question = placement_wire.question_from_proto(request)
        self._registry.sweep()  # only live nodes count as cover
        await self.persist_epoch()
        served = served_spans(self._registry.node_views(), question.model, question.costs.n_layers)
        advice = suggest_layers(question.costs, question.budget_bytes, served)
        logger.info("suggested layers %s of %s (%s)", advice.layers, question.model, advice.reason)
        return placement_wire.advice_to_proto(advice)

    async def sweep_forever(self, period_s: float, sleep: Sleep = asyncio.sleep) -> None:
        """Expire silent nodes even when no call arrives, so the epoch moves on time (K4).

        The loop's watcher runs beside it as its own task (``watch_loop``): a sweep waiting on
        the store must not leave a stall meanwhile unwatched, nobody's lateness."""
        watcher = asyncio.ensure_future(watch_loop(self._registry.hearing, self._registry.now, period_s, sleep))
        try:
            while True:
                await sleep(period_s)
                await self._sweep_once()
        finally:
            watcher.cancel()

    async def _sweep_once(self) -> None:
        late = self._registry.hearing.recent_lag_s()
        if late > self._registry.expire_after_s:
            logger.warning("the tracker runs %.2f s behind; no node is expired for that time", late)
        self._registry.sweep()
        try:
            await self.persist_epoch()
        except Exception:
            # A failed write (disk full, I/O error) must not stop expiry; the next sweep or
            # reply retries it, and replies wait for it, so nothing unsaved is handed out.
            self._epoch.forget_failed_write()
            logger.exception("could not persist epoch %d", self._registry.epoch)
