"""One generation's frames along a route, and every answer's wait bounded.

``RouteSession`` is where a generation runs (its hops and the identity every frame carries),
``RouteRun`` one run's fixed context there; ``send_prefill`` sends the prompt, the first frame
opening the session on every hop and the last asking the tail to sample, and ``replay_history``
feeds a lost route's tokens as the decode steps they were. Every answer is awaited within what
that step should take on the route's hops, as their nodes measured it (``RouteRun.within``,
``core.step_budget``). The driver (``route.driver``) decides what to send and reads the decode
loop's answers; an embedding (``route.embedding``) sends only the prefill.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field

import numpy as np

from meshnet.core.embedding import EmbeddingSpec
from meshnet.core.errors import DeadlineExceeded, IntegrityError, StepTimedOut
from meshnet.core.events import PrefillProgress, RouteHop
from meshnet.core.features import takes_ring_batches
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import RequestId, SessionId
from meshnet.core.prefix import KvPlan
from meshnet.core.snapshot import SnapshotPlan
from meshnet.core.step_budget import StepBudget
from meshnet.core.tickets import SealedTicket
from meshnet.route.hop_progress import HopProgress
from meshnet.route.shard_stream import ShardStream
from meshnet.wire.frames import Continuation, FrameMeta, HopSpec, Phase, StepFrame, StepResult
from meshnet.wire.prefill import PrefillChunk

REPLAY_PROGRESS_TOKENS = 16
"""A failover replay reports progress every this many re-fed tokens (each is one step)."""
CHUNKS_AHEAD = 2
"""Prefill chunks that may still be on their way through the route ahead of the one just sent:
the head forwards chunk c only once the tail answered chunk c - 2 (``node.ring``'s
MAX_CHUNKS_IN_FLIGHT), so a chunk's answer may wait for those too."""


@dataclass(frozen=True)
class RouteSession:
    """Where one generation runs: the hops and the identity every frame must carry."""

    request_id: RequestId
    session_id: SessionId
    hops: tuple[RouteHop, ...]
    fingerprint: str
    epoch: int
    ticket: SealedTicket | None = None
    """The tracker's ticket for this session's route, carried in the opening frame: every shard
    refuses to open the session without a valid one (``core.tickets``)."""

    def downstream(self) -> tuple[HopSpec, ...]:
        """The hops after the head, as the opening frame lists them: each says whether it takes
        ring batches, from the features its record advertised."""
        return tuple(
            HopSpec(h.address, h.layers, self.fingerprint, h.node_id, takes_ring_batches(h.capability.features))
            for h in self.hops[1:]
        )


@dataclass(frozen=True)
class RouteRun:
    """One generation's fixed context: where its frames go and what each of them carries."""

    route: RouteSession
    request: GenerationRequest
    deadline: float | None
    stream: ShardStream
    plan: Continuation | None
    """Head-driven decode: set on the last frame we send; None when that frame's token is the last."""
    budget: StepBudget = field(default_factory=StepBudget)
    kv: KvPlan | None = None
    """What the opening frame reuses and asks each shard to keep (``route.kv_plan``)."""
    snapshot: SnapshotPlan | None = None
    """The snapshot the opening frame restores on every shard (``route.snapshot_resume``)."""
    embedding: EmbeddingSpec | None = None
    """An embedding session (``route.embedding``): the tail pools the prompt, samples nothing."""
    progress: HopProgress | None = None
    """When each hop last answered any session of the driver (``route.hop_progress``): a step past
    its budget waits on while its hops answer others; None: the budget alone bounds it."""

    @property
    def cached_tokens(self) -> int:
        return 0 if self.kv is None else self.kv.reused_blocks * self.route.hops[0].capability.prefill_chunk_tokens

    def meta(self, step: int, position: int, phase: Phase) -> FrameMeta:
        return route_frame_meta(self.route, step, position, phase, self.deadline)

    async def within(self, answer: Awaitable[StepResult], step: int, tokens: int, *, prefill: bool) -> StepResult:
        """``answer``, unless the route takes longer for step ``step`` (``tokens`` tokens through
        every hop) than its nodes' measured speeds allow while its hops answer nothing else (a
        step queued behind other sessions waits on: ``route.hop_progress``): then the route
        failed (``StepTimedOut``)."""
        capabilities = [hop.capability for hop in self.route.hops]
        budget_s = self.budget.seconds(capabilities, tokens, prefill=prefill)
        if budget_s is None:
            result = await answer  # unmeasured hops: only the request's deadline and keepalive bound it
        else:
            windows = max(1, max(capability.max_sessions for capability in capabilities))
            result = await self._bounded(answer, step, budget_s, windows)
        if self.progress is not None:
            self.progress.answered(hop.address for hop in self.route.hops)
        return result

    async def _bounded(self, answer: Awaitable[StepResult], step: int, budget_s: float, windows: int) -> StepResult:
        addresses = [hop.address for hop in self.route.hops]
        waiting = asyncio.ensure_future(answer)
        sent = time.monotonic()
        try:
            for window in range(1, windows + 1):
                done, _ = await asyncio.wait((waiting,), timeout=budget_s)
                if done:
                    return waiting.result()
                moving = self.progress is not None and self.progress.moving(addresses, since=sent, window_s=budget_s)
                if not moving or window == windows:
                    break
        finally:
            if not waiting.done():
                waiting.cancel()
        raise StepTimedOut(
            f"the route through {', '.join(addresses)} gave no answer to step {step} within "
            f"{time.monotonic() - sent:.1f} s (the step budget its nodes' measured speeds allow is {budget_s:.1f} s, "
            f"renewed while its hops answered other sessions): the head {addresses[0]} or a hop after it is hung"
        )


class PrefillTally:
    """Where the prefill stands: tokens through the route, the last result, the next step."""

    def __init__(self, total: int, started: float) -> None:
        self.total = total
        self.started = started
        self.done = 0
        self.result: StepResult | None = None
        self.step = 0

    def advance(self, tokens: int, result: StepResult | None, *, replay: bool) -> PrefillProgress:
        self.done += tokens
        self.result = result
        self.step += 1
        return PrefillProgress(self.done, self.total, time.perf_counter() - self.started, replay)


async def send_prefill(
    run: RouteRun, chunks: Sequence[PrefillChunk], tally: PrefillTally, *, last_continues: bool
) -> AsyncIterator[PrefillProgress]:
    """Send the prompt, one frame per chunk; the first frame opens the route, the last samples."""
    downstream = run.route.downstream()
    for step, chunk in enumerate(chunks):
        frame = StepFrame(
            meta=run.meta(step, chunk.position, "prefill"),
            tokens=np.ascontiguousarray(chunk.payload),
            downstream=downstream if step == 0 else (),
            sampling=run.request.sampling if step == 0 else None,
            ticket=run.route.ticket if step == 0 else None,
            kv=run.kv if step == 0 else None,
            snapshot=run.snapshot if step == 0 else None,
            embedding=run.embedding if step == 0 else None,
            final_chunk=chunk.final_chunk,
            continuation=run.plan if chunk.final_chunk and last_continues else None,
            # After the opening frame: on the ring, so prefill chunks pipeline along the route.
            ring=step > 0,
            want_timings=True,  # the head's decode loop asks for them too (``route.hop_timing``)
        )
        # The answer may wait for the chunks still ahead of this one on the route (pipelined).
        tokens = sum(len(ahead.payload) for ahead in chunks[max(0, step - CHUNKS_AHEAD) : step + 1])
        answer = await run.within(run.stream.exchange(frame), step, tokens, prefill=True)
        yield tally.advance(len(chunk.payload), answer, replay=False)


async def replay_history(
    run: RouteRun, history: Sequence[int], tally: PrefillTally, step: int
) -> AsyncIterator[PrefillProgress]:
    """Feed each token of a lost route as the one-token decode step it was.

    Every shard then computes exactly what the lost route computed (a prefill of them would take
    other kernel paths). The tail re-samples each; a mismatch means the routes differ. Progress
    is reported every ``REPLAY_PROGRESS_TOKENS`` tokens, so a long replay is not silent.
    """
    tally.step = step
    for index, token in enumerate(history):
        result = tally.result
        if result is None or result.token_id != token:
            raise IntegrityError(
                f"replay diverged at position {None if result is None else result.next_position}: the new route "
                f"sampled {None if result is None else result.token_id}, the lost route had {token}"
            )
        last = index == len(history) - 1
        frame = StepFrame(
            meta=run.meta(tally.step, result.next_position, "decode"),
            tokens=np.array([token], np.int32),
            continuation=run.plan if last else None,
            ring=True,
            want_timings=True,
        )
        answer = await run.within(run.stream.exchange(frame), tally.step, 1, prefill=False)
        event = tally.advance(1, answer, replay=True)
        if last or (index + 1) % REPLAY_PROGRESS_TOKENS == 0:
            yield event


def route_frame_meta(
    route: RouteSession, step: int, position: int, phase: Phase, deadline: float | None = None
) -> FrameMeta:
    """The header of step ``step`` of ``route``'s session, as the head receives it."""
    remaining = seconds_left(deadline)
    if remaining is not None and remaining <= 0:
        raise DeadlineExceeded("the request's deadline passed")
    return FrameMeta(
        request_id=route.request_id,
        session_id=route.session_id,
        route_epoch=route.epoch,
        fingerprint=route.fingerprint,
        layers=route.hops[0].layers,
        phase=phase,
        position=position,
        step=step,
        cache="new" if step == 0 else "continue",
        deadline_ms=None if remaining is None else max(int(remaining * 1000), 1),
    )


def seconds_left(deadline: float | None) -> float | None:
    """Seconds until ``deadline`` (monotonic; negative once passed), None without one."""
    return None if deadline is None else deadline - time.monotonic()
