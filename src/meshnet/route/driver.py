"""Drive one generation along a route of shards: chunked prefill, then the head decodes on.

The driver talks only to the head; each shard forwards its boundary to the next, the tail
samples, and the token travels back: straight to the head (the ring, ``node.ring``) for every
frame after the opening one, which also lets prefill chunks pipeline along the route. The last
frame sent asks the head to go on decoding by itself (a ``Continuation``), so after the prefill
the driver only reads one answer per token. Every frame carries the remaining budget, so the
route never works past the request's deadline, and every wait for an answer is bounded by what
that step should take on the route's hops, as their nodes measured it (``core.step_budget``): a
hop that stops answering fails the route with ``StepTimedOut`` within seconds, which the swarm
client fails over like a lost hop, instead of holding the request until its deadline. The
driver stops at the end ``route.life`` decides for a token it can see (a stop token, the
budget); closing the iterator earlier (a stop string, a cancelled task) cancels the head
stream, which frees the session's KV on every shard down the route. Frames are sized from the
capability each hop of the route carries (``RouteHop``): the driver asks no shard anything
before it starts.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Literal

import numpy as np

from meshnet.core.errors import InvalidArgument, PrefixEvicted, SnapshotRefused
from meshnet.core.events import (
    DecodeStarted,
    GenerationEvent,
    PrefillCompleted,
    PrefillStarted,
    RouteHealth,
    RouteHop,
    TokenGenerated,
)
from meshnet.core.generation import GenerationRequest
from meshnet.core.prefix import KvPlan
from meshnet.core.snapshot import SnapshotPlan
from meshnet.core.step_budget import StepBudget
from meshnet.route.hop_progress import HopProgress
from meshnet.route.hop_timing import hop_latencies, timing_due
from meshnet.route.kv_plan import plan_for
from meshnet.route.life import finish_for
from meshnet.route.route_run import PrefillTally, RouteRun, RouteSession, replay_history, seconds_left, send_prefill
from meshnet.route.shard_stream import ChannelPool, ShardStream
from meshnet.route.snapshot_resume import plan_resume
from meshnet.wire.frames import FRAME_OVERHEAD_BYTES, Continuation
from meshnet.wire.prefill import PrefillChunk, split_prefill

log = logging.getLogger(__name__)

RATE_WINDOW = 16
"""Tokens over which the rolling tokens/s is measured."""


class RouteDriver:
    def __init__(self, pool: ChannelPool, *, max_frame_bytes: int, budget: StepBudget | None = None) -> None:
        self.pool = pool
        self._max_frame_bytes = max_frame_bytes
        self.budget = budget or StepBudget()
        self.progress = HopProgress()
        """When each hop last answered any of this driver's sessions: a queued step waits on."""

    async def run(
        self,
        route: RouteSession,
        request: GenerationRequest,
        *,
        history: Sequence[int] = (),
        kv: KvPlan | Literal["probe"] | None = "probe",
        snapshot: SnapshotPlan | None = None,
    ) -> AsyncGenerator[GenerationEvent, None]:
        """Yield prefill/decode events and one TokenGenerated per new token.

        ``history`` holds tokens already generated on an earlier route: they are replayed after
        the prompt, so a failover continues exactly where the lost route stopped. The decode
        loop is this generator's own: one frame per token between the stream and the caller.
        ``kv``: the prompt KV to reuse (``plan``), or "probe" to ask the hops here; ``snapshot``:
        the session's KV snapshot every hop restores (``route.snapshot_resume``), so only the
        history after it is replayed; one a hop refuses or lost falls back to a replay from 0.
        """
        if not route.hops:
            raise InvalidArgument("a route needs at least one hop")
        if snapshot is not None:
            try:
                async for event in self._attempt(route, request, history, None, snapshot):
                    yield event
                return
            except (PrefixEvicted, SnapshotRefused) as refused:
                # Refused at the opening frame (before any token): replay the session from 0.
                reason = f"the snapshot at position {snapshot.position} was not restored ({refused.message})"
                log.warning("%s: replaying from 0", reason)
                yield RouteHealth(refused.code, f"{reason}; replaying the session from its first token")
        plan = await self.plan(route, request) if kv == "probe" else kv
        try:
            async for event in self._attempt(route, request, history, plan):
                yield event
        except PrefixEvicted:
            if plan is None or not plan.reused_blocks:
                raise
            # A hop let the prefix go between the probe and the opening (its lease ran out):
            # nothing ran past the opening frame, so open the session again computing it all.
            async for event in self._attempt(route, request, history, plan.reusing_nothing()):
                yield event

    async def plan(self, route: RouteSession, request: GenerationRequest) -> KvPlan | None:
        """The prompt KV ``route``'s hops hold for ``request`` now (``route.kv_plan``)."""
        return await plan_for(self.pool, route.hops, route.fingerprint, request)

    async def resume(
        self, route: RouteSession, request: GenerationRequest, history: Sequence[int]
    ) -> SnapshotPlan | None:
        """The snapshot of the session ``route``'s hops all hold, to resume it from after a
        failover (``route.snapshot_resume``); None: replay it from 0."""
        prompt = request.prompt_tokens
        return await plan_resume(self.pool, route.hops, route.fingerprint, route.session_id, prompt, history)

    async def _attempt(
        self,
        route: RouteSession,
        request: GenerationRequest,
        history: Sequence[int],
        plan: KvPlan | None,
        snapshot: SnapshotPlan | None = None,
    ) -> AsyncGenerator[GenerationEvent, None]:
        deadline = None if request.timeout_s is None else time.monotonic() + request.timeout_s
        head = route.hops[0]
        stream = ShardStream(self.pool, head.address, seconds_left(deadline), head.node_id)
        try:
            # The last frame we send asks the head to decode on by itself (head-driven decode),
            # so from then on we only read: our round trip leaves the per-token critical path.
            continuation = _continuation(request, len(history))
            run = RouteRun(
                route, request, deadline, stream, continuation, self.budget, plan, snapshot, progress=self.progress
            )
            progress = PrefillTally(len(request.prompt_tokens) + len(history), time.perf_counter())
            async for event in self._prefill_and_replay(run, history, progress):
                yield event
            rate = _Rate()
            produced, result = len(history), progress.result
            decoded = -1  # the first token comes from the prefill's answer, not a decode step
            while result is not None and result.token_id is not None:
                token = result.token_id
                hops = hop_latencies(route.hops, result.timings) if timing_due(decoded) else ()
                yield TokenGenerated(token, produced, rate.tick(), logprobs=result.logprobs, hops=hops)
                produced, decoded = produced + 1, decoded + 1
                if finish_for(request, produced, token) is not None or run.plan is None:
                    return
                step = progress.step - 1 + produced - len(history)  # the head's steps go on from our last
                result = await run.within(stream.read(), step, 1, prefill=False)
        finally:
            stream.cancel()

    async def _prefill_and_replay(
        self, run: RouteRun, history: Sequence[int], progress: PrefillTally
    ) -> AsyncIterator[GenerationEvent]:
        cached, prompt = run.cached_tokens, len(run.request.prompt_tokens)
        start = cached if run.snapshot is None else run.snapshot.position
        if start < prompt:
            chunks = self.prefill_chunks(run.request, run.route.hops, start)
        else:  # resumed past the prompt: the token at the snapshot's end opens the session
            token = np.array([history[start - prompt]], np.int32)
            chunks = [PrefillChunk(start, token, final_chunk=True)]
            history = history[start - prompt + 1 :]
        progress.done = start
        yield PrefillStarted(progress.total, cached)
        async for chunk_done in send_prefill(run, chunks, progress, last_continues=not history):
            if run.snapshot is not None and progress.step == 1:  # the opening frame restored it
                yield RouteHealth("resumed", f"every hop restored the session's snapshot of {start} positions")
            yield chunk_done
        async for replayed in replay_history(run, history, progress, len(chunks)):
            yield replayed
        yield PrefillCompleted(progress.total, time.perf_counter() - progress.started)
        yield DecodeStarted()

    def prefill_chunks(self, request: GenerationRequest, hops: Sequence[RouteHop], start: int) -> list[PrefillChunk]:
        """The prompt from ``start`` (where the reused KV ends) in frames."""
        prompt = np.asarray(request.prompt_tokens[start:], dtype=np.int32)
        head = hops[0].capability
        # Every frame of the prompt crosses every hop (as token ids into the head, as hidden rows
        # after it), so it must fit the smallest frame any of them, or this driver, accepts; the
        # hidden rows are the larger, so size the chunks for the boundary tensor.
        frame_bytes = min(self._max_frame_bytes, *(hop.capability.max_frame_bytes for hop in hops))
        rows_per_frame = max(1, (frame_bytes - FRAME_OVERHEAD_BYTES) // (4 * head.n_embd))
        rows = min(rows_per_frame, *(hop.capability.max_tokens_per_frame for hop in hops))
        # One engine call's worth per frame (cut at the same absolute multiples the shards cut
        # at, so the numerics are those of one big frame): the route pipelines the frames.
        chunk = head.prefill_chunk_tokens
        if chunk <= rows:
            rows = chunk
        return split_prefill(prompt, start, frame_bytes, max_tokens=rows)


def _continuation(request: GenerationRequest, replayed: int) -> Continuation | None:
    """What the head decodes on its own after our last frame: the tokens left but the one that
    frame samples, ended early by a stop token; None when that one token is the last."""
    budget = request.max_tokens - replayed - 1
    return Continuation(budget, request.stop_tokens) if budget > 0 else None


class _Rate:
    """The rolling decode rate over the last ``RATE_WINDOW`` tokens."""

    def __init__(self) -> None:
        self._stamps: deque[float] = deque(maxlen=RATE_WINDOW)

    def tick(self) -> float:
        self._stamps.append(time.perf_counter())
        if len(self._stamps) < 2:
            return 0.0
        return (len(self._stamps) - 1) / (self._stamps[-1] - self._stamps[0])
