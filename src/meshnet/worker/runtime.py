"""The shard runtime: checks every frame against this shard and its session table, runs it on
the engine loop, forwards the boundary downstream or samples at the tail.

It knows nothing of gRPC servicers; ``servicer.py`` adapts it to the wire.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from meshnet.client.shard_stream import ChannelPool, ShardStream
from meshnet.core.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    Unavailable,
)
from meshnet.core.generation import SamplingParams
from meshnet.core.ids import NodeId, SessionId
from meshnet.engine.backend import StepInput
from meshnet.engine.sampling import sample_token
from meshnet.protocol.frames import (
    SUPPORTED_SCHEMA_VERSIONS,
    CapabilityInfo,
    FrameLimits,
    HopTiming,
    StepFrame,
    StepResult,
)
from meshnet.session.admission import CapacityPlan
from meshnet.session.engine_loop import EngineLoop
from meshnet.session.table import Session, SessionTable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardIdentity:
    node_id: NodeId
    address: str
    fingerprint: str
    backend: str
    backend_version: str
    certified: bool
    max_frame_bytes: int


class ShardRuntime:
    def __init__(self, identity: ShardIdentity, loop: EngineLoop, table: SessionTable, capacity: CapacityPlan) -> None:
        self.identity = identity
        self.capacity = capacity
        self.loop = loop
        self.table = table
        self.shape = loop.backend.shape
        self.draining = False
        self._pool = ChannelPool(identity.max_frame_bytes)
        self.limits = FrameLimits(
            n_embd=self.shape.n_embd,
            max_frame_bytes=identity.max_frame_bytes,
            max_tokens_per_frame=self.shape.n_ctx_per_slot,
            vocab_size=self.shape.n_vocab or None,
        )

    # -- frames ---------------------------------------------------------------------------

    async def handle(self, frame: StepFrame, stream_deadline: float | None) -> StepResult:
        """Run one frame of a session; the caller owns the stream the session lives on."""
        meta = frame.meta
        self._check_identity(frame)
        if meta.cache == "new" and meta.step == 0 and meta.session_id not in self.table:
            session = await self._open(frame, stream_deadline)
            try:
                return await self._run(session, frame)
            except BaseException:
                await self.end(meta.session_id, "its opening frame failed")
                raise
        return await self._run(self.table.get(meta.session_id), frame)

    async def _run(self, session: Session, frame: StepFrame) -> StepResult:
        meta = frame.meta
        if (
            self.table.check_step(session, step=meta.step, position=meta.position, epoch=meta.route_epoch)
            == "duplicate"
        ):
            return session.last_result  # idempotent: answered again, nothing appended
        received = time.perf_counter()
        deadline = None if meta.deadline_ms is None else time.monotonic() + meta.deadline_ms / 1000.0
        session.busy = True
        try:
            output = await self.loop.run_step(self._input(session, frame), deadline=deadline)
            computed = time.perf_counter()
            timing = HopTiming(self.identity.address, self.shape.layers, 0, int((computed - received) * 1e6))
            next_position = meta.position + frame.n_tokens
            if self.shape.emits_logits:
                token = None
                if frame.final_chunk:
                    sampling: SamplingParams = session.context["sampling"]
                    token = sample_token(output.logits[-1], sampling, next_position)  # type: ignore[index]
                result = StepResult(meta.session_id, meta.step, next_position, token, (timing,))
            else:
                result = await self._forward(session, frame, output.hidden, deadline, timing)  # type: ignore[arg-type]
        finally:
            session.busy = False
        self.table.record(session, step=meta.step, next_position=next_position, result=result)
        return result

    async def continue_decoding(
        self, frame: StepFrame, result: StepResult, stream_deadline: float | None
    ) -> AsyncIterator[StepResult]:
        """Head-driven decode after ``frame``: feed each sampled token back in, yield each result.

        Each step is a decode frame like one the sender would have sent (same checks, same
        idempotency bookkeeping), so a sender can switch between driving and reading freely.
        """
        plan = frame.continuation
        if plan is None:
            return
        stops = plan.stop_token_ids
        for offset in range(1, plan.max_steps + 1):
            if result.token_id is None or result.token_id in stops:
                return
            remaining_ms = None if stream_deadline is None else int((stream_deadline - time.monotonic()) * 1000)
            if remaining_ms is not None and remaining_ms <= 0:
                raise DeadlineExceeded("the session's deadline passed while decoding")
            meta = replace(
                frame.meta,
                phase="decode",
                position=result.next_position,
                step=frame.meta.step + offset,
                cache="continue",
                deadline_ms=remaining_ms,
            )
            step = StepFrame(meta=meta, tokens=np.array([result.token_id], np.int32))
            result = await self._run(self.table.get(meta.session_id), step)
            yield result

    def _check_identity(self, frame: StepFrame) -> None:
        meta = frame.meta
        if meta.fingerprint != self.identity.fingerprint:
            raise FailedPrecondition(
                f"frame for recipe {meta.fingerprint} reached a shard serving {self.identity.fingerprint}"
            )
        if meta.layers != self.shape.layers:
            raise FailedPrecondition(f"frame asks for layers {meta.layers}; this shard runs {self.shape.layers}")
        if frame.downstream:
            # Only where the route continues, and only to its end: a frame must not be able to
            # make a shard open channels to arbitrary addresses.
            if self.shape.emits_logits or meta.cache != "new":
                raise InvalidArgument("downstream hops belong only in the opening frame of a non-tail shard")
            if frame.downstream[-1].layers.stop != self.shape.n_layers:
                raise InvalidArgument(
                    f"the route's hops end at layer {frame.downstream[-1].layers.stop}, "
                    f"not at the model's {self.shape.n_layers}"
                )
        elif not self.shape.emits_logits and meta.cache == "new":
            raise InvalidArgument("a non-tail shard needs the downstream hops in the opening frame")
        if frame.continuation is not None and not self.shape.takes_tokens:
            raise InvalidArgument("only the head can decode on by itself (continuation)")

    async def _open(self, frame: StepFrame, stream_deadline: float | None) -> Session:
        if self.draining:
            raise Unavailable("this shard is draining for shutdown and takes no new sessions")
        meta = frame.meta
        if self.shape.emits_logits and frame.sampling is None:
            raise InvalidArgument("the opening frame must carry the sampling parameters for the tail")
        session, evicted = self.table.open(meta.session_id, meta.request_id, meta.route_epoch, self.loop.queue_depth)
        if evicted is not None:
            await self._teardown(evicted)
        session.context["sampling"] = frame.sampling
        session.context["downstream_hops"] = frame.downstream
        if frame.downstream:
            timeout = None if stream_deadline is None else max(stream_deadline - time.monotonic(), 0.001)
            session.context["link"] = ShardStream(self._pool, frame.downstream[0].address, timeout)
        return session

    def _input(self, session: Session, frame: StepFrame) -> StepInput:
        want: Literal["last", "none"] = "last" if frame.final_chunk else "none"
        if frame.tokens is not None:
            return StepInput(session.slot, frame.meta.position, tokens=frame.tokens, want_logits=want)
        return StepInput(session.slot, frame.meta.position, hidden=frame.hidden, want_logits=want)

    async def _forward(
        self, session: Session, frame: StepFrame, hidden: np.ndarray, deadline: float | None, timing: HopTiming
    ) -> StepResult:
        link: ShardStream = session.context["link"]
        hops = session.context["downstream_hops"]
        remaining_ms = None if deadline is None else int((deadline - time.monotonic()) * 1000)
        if remaining_ms is not None and remaining_ms <= 0:
            raise DeadlineExceeded("the step's deadline passed on this shard")
        opening = frame.meta.cache == "new" and frame.meta.step == 0
        outgoing = StepFrame(
            meta=replace(frame.meta, layers=hops[0].layers, deadline_ms=remaining_ms),
            hidden=hidden,
            downstream=tuple(hops[1:]) if opening else (),
            sampling=frame.sampling if opening else None,
            final_chunk=frame.final_chunk,
        )
        answer = await link.exchange(outgoing)
        return replace(answer, timings=(timing, *answer.timings))

    # -- session ends -------------------------------------------------------------------

    async def end(self, key: SessionId, reason: str) -> bool:
        """Free the session's KV here and close its downstream stream; False if it was not here."""
        session = self.table.close(key, reason=reason)
        if session is None:
            return False
        await self._teardown(session)
        return True

    async def _teardown(self, session: Session) -> None:
        link: ShardStream | None = session.context.pop("link", None)
        try:
            await self.loop.truncate(session.slot, 0)
        finally:
            if link is not None:
                await link.close()

    async def expire_idle(self) -> int:
        keys = self.table.expired()
        for key in keys:
            await self.end(key, "expired after its time to live")
        return len(keys)

    async def close(self) -> None:
        for session in self.table.sessions():
            await self.end(session.key, "the shard shut down")
        await self._pool.close()

    # -- introspection ------------------------------------------------------------------

    def capability(self) -> CapabilityInfo:
        shape = self.shape
        return CapabilityInfo(
            node_id=self.identity.node_id,
            fingerprint=self.identity.fingerprint,
            layers=shape.layers,
            n_layers=shape.n_layers,
            n_embd=shape.n_embd,
            vocab_size=max(shape.n_vocab, 1),
            schema_versions=SUPPORTED_SCHEMA_VERSIONS,
            backend=self.identity.backend,
            backend_version=self.identity.backend_version,
            max_sessions=shape.max_slots,
            free_sessions=0 if self.draining else self.table.free_slots,
            active_sessions=len(self.table),
            n_ctx_per_session=shape.n_ctx_per_slot,
            max_frame_bytes=self.identity.max_frame_bytes,
            max_tokens_per_frame=self.limits.max_tokens_per_frame,
            certified=self.identity.certified,
        )

    def metrics(self) -> dict[str, float]:
        stats, table = self.loop.stats, self.table
        return {
            "active_sessions": float(len(table)),
            "free_sessions": float(table.free_slots),
            "kv_used_fraction": len(table) / max(self.shape.max_slots, 1),
            "queue_depth": float(self.loop.queue_depth),
            "decode_steps_total": float(stats.decode_steps),
            "decode_batches_total": float(stats.decode_batches),
            "batch_occupancy": stats.decode_steps / max(stats.decode_batches, 1),
            "prefill_tokens_total": float(stats.prefill_tokens),
            "engine_busy_seconds_total": stats.busy_seconds,
            "rejected_admissions_total": float(table.rejections),
            "evictions_total": float(table.evictions),
            "expired_steps_total": float(stats.expired),
            "draining": float(self.draining),
            "kv_bytes_per_session": float(self.capacity.kv_bytes_per_session),
            "kv_bytes_in_use": float(self.capacity.kv_bytes_per_session * len(table)),
            "weight_bytes": float(self.capacity.weight_bytes),
        }
