"""A shard: checks every frame against itself and its session table, runs it on the engine loop
and hands the output to its role's stages (``stages.py``, ``forward_stage.py``), which are
chosen once, in ``shard_wiring.build_shard``.

It knows nothing of gRPC; ``servicer.py`` adapts it to the wire.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Generic, TypeVar

from meshnet.core.errors import FailedPrecondition, InvalidArgument, MeshnetError, Unavailable
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.node_record import NodeRecord
from meshnet.engine.backend import StepInput
from meshnet.node.forward_stage import Downstream
from meshnet.node.kv_reuse import KvReuse
from meshnet.node.metrics import ShardMetrics
from meshnet.node.ring import RingMailbox, TailState
from meshnet.node.session_counts import SessionCounts
from meshnet.node.stages import Continuation, OutputStage, Rows
from meshnet.node.tickets import TicketGate
from meshnet.route.coalescer import SeamCount
from meshnet.session.admission import CapacityPlan
from meshnet.session.engine_loop import EngineLoop
from meshnet.session.table import Session, SessionTable
from meshnet.wire.frames import (
    SUPPORTED_SCHEMA_VERSIONS,
    CapabilityInfo,
    FrameLimits,
    HopTiming,
    StepFrame,
    StepResult,
)

S = TypeVar("S")


class Shard(Generic[S]):
    """One loaded layer range serving sessions; ``S`` is what its output stage keeps per session.

    It enforces its node's record: frames of the record's recipe, within its capability's limits."""

    def __init__(
        self,
        node_id: NodeId,
        record: NodeRecord,
        loop: EngineLoop,
        table: SessionTable[S],
        capacity: CapacityPlan,
        output: OutputStage[S],
        continuation: Continuation,
        tickets: TicketGate,
        kv: KvReuse,
        seams: SeamCount | None = None,
    ) -> None:
        self.node_id = node_id
        self.record = record
        self.shape = loop.backend.shape
        self._loop = loop
        self._table = table
        self._capacity = capacity
        self._output = output
        self._continuation = continuation
        self._tickets = tickets
        self.kv = kv
        self._draining = False
        self.seams = SeamCount() if seams is None else seams
        """Messages and session rows this worker sent across its seams (shared with its senders)."""
        self._capability_calls = 0
        self.counts = SessionCounts()
        """What each session computed here, for the tracker's check of work records."""
        # Its own recipe, and its family's for a mixed-device route (the tracker plans one only
        # where the swarm opted in and the device's drift was measured).
        self._recipes = (record.fingerprint, record.recipe.family_fingerprint())
        capability = record.capability
        self.limits = FrameLimits(
            n_embd=capability.n_embd,
            max_frame_bytes=capability.max_frame_bytes,
            max_tokens_per_frame=capability.max_tokens_per_frame,
            vocab_size=self.shape.n_vocab or None,
        )

    # -- frames ---------------------------------------------------------------------------

    async def handle(self, frame: StepFrame, stream_deadline: float | None, opener: str | None = None) -> StepResult:
        """Run one frame of a session; the caller owns the stream the session lives on.

        ``opener``: the node id of the stream's sender, which an opening frame's route ticket must
        name (None on an unsecured shard, where nobody's identity is checked)."""
        meta = frame.meta
        self._check(frame)
        if meta.cache != "new":
            return await self._run(self._table.get(meta.session_id), frame)
        # Before anything is taken over, opened or dialled: the tracker's word for this route.
        ticket = self._tickets.admit(frame, self.node_id, self.record.address, self.shape.layers, opener)
        if meta.step == 0:
            await self._supersede(meta.session_id, meta.route_epoch)
        if meta.step == 0 and meta.session_id not in self._table:
            session = await self._open(frame, stream_deadline, opener)
            self._tickets.hold(meta.session_id, meta.route_epoch, ticket)
            try:
                await self._reuse(session, frame)
                return await self._run(session, frame)
            except BaseException:
                await self.end(meta.session_id, "its opening frame failed")
                raise
        return await self._run(self._table.get(meta.session_id), frame)

    async def _supersede(self, key: SessionId, epoch: int) -> None:
        """An opening frame of a newer route for a session held here ends the held one (only once
        the frame's ticket, of that newer epoch, was admitted: nobody else can take a session over).

        The tracker moves the epoch on whenever a session's route changes, and a failover replays
        the session onto its new route under the same id; a shard kept on the new route may still
        hold the session the lost route opened (nothing reaches it over a link that went down), and
        its KV and links are worthless now. A repeated opening frame (same epoch) is not a newer
        route: it is answered again as any repeated step."""
        held = self._table.find(key)
        if held is not None and epoch > held.epoch:
            await self.end(key, f"superseded by the session's route of epoch {epoch}")

    def continue_decoding(
        self, frame: StepFrame, result: StepResult, stream_deadline: float | None
    ) -> AsyncIterator[StepResult]:
        """The steps this shard runs by itself after ``frame`` answered ``result`` (head only)."""
        return self._continuation.steps(frame, result, stream_deadline, self._next_step)

    async def _next_step(self, frame: StepFrame, computed: asyncio.Future[None] | None = None) -> StepResult:
        return await self._run(self._table.get(frame.meta.session_id), frame, computed)

    def _check(self, frame: StepFrame) -> None:
        meta = frame.meta
        if meta.fingerprint not in self._recipes:
            raise FailedPrecondition(
                f"frame for recipe {meta.fingerprint} reached a shard serving {self.record.fingerprint}"
            )
        if meta.layers != self.shape.layers:
            raise FailedPrecondition(f"frame asks for layers {meta.layers}; this shard runs {self.shape.layers}")
        if meta.cache == "continue" and not frame.ring:
            # Only the opening frame travels off the ring (``StepFrame`` refuses it on one); an
            # old or hostile sender's chain frame has no path through a route any more.
            raise InvalidArgument("every frame after a session's opening one must be a ring frame")
        self._output.check(frame)

    async def _open(self, frame: StepFrame, stream_deadline: float | None, opener: str | None) -> Session[S]:
        if self._draining:
            raise Unavailable("this shard is draining for shutdown and takes no new sessions")
        self._output.check_opening(frame)
        meta = frame.meta
        session, evicted = self._table.open(
            meta.session_id,
            meta.route_epoch,
            self._loop.queue_depth,
            lambda: self._output.open_state(frame, stream_deadline),
            opener=opener,  # peers are bounded per certificate (``session.admission``)
        )
        if evicted is not None:
            await self._teardown(evicted)
        return session

    async def _reuse(self, session: Session[S], frame: StepFrame) -> None:
        """Restore the KV the opening frame's plan reuses (exact routes only: a mixed-device
        route's hops computed what they hold on other devices than this route's)."""
        meta = frame.meta
        if frame.kv is not None and meta.fingerprint != self.record.fingerprint:
            raise InvalidArgument("only an exact route (one device class) reuses stored KV")
        if frame.snapshot is not None and meta.fingerprint != self.record.fingerprint:
            raise InvalidArgument("only an exact route (one device class) restores a snapshot")
        position = await self.kv.open(
            session.key, session.slot, meta.position, frame.kv, meta.fingerprint, frame.snapshot
        )
        self._table.start_at(session, position)

    def held_kv(self, fingerprint: str, chain: tuple[bytes, ...]) -> int:
        """How many blocks of ``chain`` this shard holds KV for (0 for another recipe)."""
        return self.kv.held(chain) if fingerprint == self.record.fingerprint else 0

    async def _run(
        self, session: Session[S], frame: StepFrame, computed: asyncio.Future[None] | None = None
    ) -> StepResult:
        meta = frame.meta
        repeated = self._table.check_step(session, step=meta.step, position=meta.position, epoch=meta.route_epoch)
        if repeated is not None:
            return repeated  # idempotent: answered again, nothing appended
        received = time.perf_counter()
        deadline = None if meta.deadline_ms is None else time.monotonic() + meta.deadline_ms / 1000.0
        session.busy = True
        try:
            want = self._output.rows(session.state, frame)
            step = _engine_input(session.slot, frame, want, self._output.route_shards(session.state))
            output = await self.kv.run(session.key, step, deadline, prefill=meta.phase == "prefill")
            if computed is not None:
                # Whoever waits on this runs once the emit below has sent the frame on (its
                # first suspension), so the frame leaves before the waiter's own work.
                computed.set_result(None)
            timing = None
            if frame.want_timings:  # only a probe reads them
                compute_us = int((time.perf_counter() - received) * 1e6)
                timing = HopTiming(self.record.address, self.shape.layers, 0, compute_us)
            result = await self._output.emit(session.state, frame, output, deadline, timing)
        finally:
            session.busy = False
        self._table.record(session, step=meta.step, next_position=meta.position + frame.n_tokens, result=result)
        if result.token_id is not None:
            self.counts.sampled(session.key, session.epoch, meta.position + frame.n_tokens)
        # A tail's ring answers are counted where they are written (the servicer's RingReturn).
        if isinstance(session.state, Downstream) and not frame.ring:
            self.seams.add(1)  # the opening frame went down its stream (ring frames: ``ForwardStage``)
        return result

    # -- the ring (``node.ring``) -----------------------------------------------------------

    def answer_upstream(self, frame: StepFrame) -> bool:
        """Whether ``frame``'s answer goes back up its stream (counted when that is a seam): the
        head answers every frame; a shard after it only the opening one, as it answers a ring
        frame round the ring (the tail) or not at all (a middle)."""
        if self.shape.takes_tokens:
            return True
        if frame.ring:
            return False
        self.seams.add(1)
        return True

    def ring_mailbox(self, key: SessionId, request_id: RequestId) -> RingMailbox:
        """Where this tail puts the session's ring answers; NotFound unless it holds the session."""
        state = self._table.get(key).state  # CacheMiss when the session is not (or no longer) here
        if not isinstance(state, TailState) or state.request_id != request_id or self.shape.takes_tokens:
            raise FailedPrecondition(f"this shard holds no tail session {key} of that request to answer on a ring")
        return state.ring

    def ring_watch(self, key: SessionId) -> asyncio.Task[StepResult] | None:
        """Ends when the session's downstream does, once its decode runs on the ring; else None."""
        state = self._state(key)
        return state.ring.watch if isinstance(state, Downstream) else None

    def _state(self, key: SessionId) -> S | None:
        return self._table.get(key).state if key in self._table else None

    def fail_ring(self, key: SessionId, error: MeshnetError, *, epoch: int | None = None) -> None:
        """The session's stream failed on this tail: tell the head reading its ring why (with
        ``epoch``, only if the session held here is the one opened on that route epoch)."""
        session = self._table.find(key)
        if session is not None and epoch in (None, session.epoch) and isinstance(session.state, TailState):
            session.state.ring.fail(error)

    # -- session ends -------------------------------------------------------------------

    async def end(self, key: SessionId, reason: str, *, epoch: int | None = None) -> bool:
        """Free the session's KV here and let go of its state; False if it was not here. With
        ``epoch``, only the session opened on that route epoch: a stream ends its own session,
        never the one a newer route opened under the same id (``_supersede``)."""
        held = self._table.find(key)
        if held is None or (epoch is not None and held.epoch != epoch):
            return False
        session = self._table.close(key, reason=reason)
        if session is None:
            return False
        self._tickets.release(key, session.epoch)
        await self._teardown(session)
        return True

    async def _teardown(self, session: Session[S]) -> None:
        self.counts.ended(session.key, session.epoch, session.next_position)
        self.kv.close(session.key)
        try:
            await self._loop.truncate(session.slot, 0)
        finally:
            await self._output.release(session.state)

    async def expire_idle(self) -> int:
        """Free the sessions idle past their time to live, and those whose route ticket expired."""
        keys = self._table.expired()
        for key in keys:
            await self.end(key, "expired after its time to live")
        lapsed = 0
        for key, epoch in self._tickets.expired():
            lapsed += await self.end(key, "its route ticket expired", epoch=epoch)
        return len(keys) + lapsed

    async def close(self) -> None:
        for session in self._table.sessions():
            await self.end(session.key, "the shard shut down")

    # -- lifecycle and introspection ----------------------------------------------------

    def start_draining(self) -> None:
        """Refuse new sessions from now on; open ones carry on."""
        self._draining = True

    @property
    def open_sessions(self) -> int:
        return len(self._table)

    def raise_min_epoch(self, epoch: int) -> None:
        """New sessions must come with a route of the tracker's current epoch or later; sessions
        already open keep the epoch they were opened with."""
        self._table.min_epoch = max(self._table.min_epoch, epoch)

    def capability(self) -> CapabilityInfo:
        """GetCapability's answer (admin and diagnostics; counted, so a test can show that no
        request asks it)."""
        self._capability_calls += 1
        return CapabilityInfo(
            node_id=self.node_id,
            record=self.record,
            schema_versions=SUPPORTED_SCHEMA_VERSIONS,
            free_sessions=0 if self._draining else self._table.free_slots,
            active_sessions=len(self._table),
        )

    def metrics(self) -> ShardMetrics:
        stats, table, store = self._loop.stats, self._table, self.kv.store
        return ShardMetrics(
            active_sessions=len(table),
            free_sessions=table.free_slots,
            max_sessions=self.shape.max_slots,
            queue_depth=self._loop.queue_depth,
            decode_steps=stats.decode_steps,
            decode_batches=stats.decode_batches,
            prefill_tokens=stats.prefill_tokens,
            engine_busy_seconds=stats.busy_seconds,
            rejected_admissions=table.rejections,
            evictions=table.evictions,
            expired_steps=stats.expired,
            draining=self._draining,
            kv_bytes_per_session=self._capacity.kv_bytes_per_session,
            weight_bytes=self._capacity.weight_bytes,
            other_bytes=self._capacity.other_bytes,
            seam_messages=self.seams.messages,
            seam_rows=self.seams.rows,
            capability_calls=self._capability_calls,
            prefix_hits=store.stats.hits,
            prefix_misses=store.stats.misses,
            prefix_reused_tokens=store.stats.reused_tokens,
            prefix_bytes=store.bytes_held,
            prefix_budget_bytes=store.budget_bytes,
            prefix_entries=len(store),
            prefix_evictions=store.stats.evictions,
            snapshots=self.kv.snapshots.figures(),
        )


AnyShard = Shard[TailState] | Shard[Downstream]
"""A shard of either output stage: what the servicer and the server hold."""


def _engine_input(slot: int, frame: StepFrame, want: Rows, route_shards: int) -> StepInput:
    rows = "all" if want == "normed" else want
    return StepInput(
        slot,
        frame.meta.position,
        frame.tokens,
        frame.hidden,
        want_logits=rows,
        read_logits=want != "normed",
        route_shards=route_shards,
    )
