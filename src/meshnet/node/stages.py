"""The role-specific parts of a shard, chosen once from its role when the shard is assembled.

A role is two independent choices, so a shard is assembled from two stages instead of being
written four times (full, head, middle, tail) or branching on its role at every frame:

- its **output stage**: a shard that ends the model (tail, full) samples the next token from its
  logits (``SampleStage``); any other forwards its boundary hidden state to the next hop and
  answers with what comes back (``ForwardStage``, in ``node.forward_stage``). Each fixes what a
  session keeps from its opening frame: the sampling parameters, or the rest of the route and
  the stream to its next hop (``Downstream``).
- its **continuation**: only a shard that takes token ids (head, full) feeds each sampled token
  back in by itself (``HeadDecodeLoop``); any other runs only the steps it is sent
  (``NoContinuation``: a frame into a shard after layer 0 cannot even carry the request, as
  ``StepFrame`` allows a continuation only with token input).

A session's opening frame travels down the chain and its answer back up it; every frame after
it is a ``ring`` frame (``node.ring``): a forwarding head sends it on and reads the tail's answer
from the RingReturn stream it opened on the tail, a middle forwards it without answering, and
the tail writes its answer into the session's ``RingMailbox``.

The input side needs no stage: a frame's own checks already fix that a shard starting at layer 0
receives token ids and any other a hidden state, so the engine input is whichever the frame holds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, Literal, Protocol, TypeVar

import numpy as np

from meshnet.core.errors import DeadlineExceeded, EngineError, InvalidArgument
from meshnet.core.generation import SamplingParams
from meshnet.engine.backend import StepOutput
from meshnet.engine.constraints import GrammarVocabulary
from meshnet.engine.pooling import pool
from meshnet.engine.tail_sampler import TailSampler
from meshnet.node.ring import RingMailbox, TailState
from meshnet.wire.frames import HopTiming, StepFrame, StepResult

S = TypeVar("S")
Rows = Literal["none", "last", "all", "normed"]
"""The rows of a frame whose tail output (logits, final-norm rows) the engine computes;
``normed``: every row, as ``all``, but only their final-norm rows are read (an embedding)."""
RunStep = Callable[[StepFrame, "asyncio.Future[None] | None"], Awaitable[StepResult]]
"""Run one step of a session; the future (if given) resolves once this shard's engine has run it."""


def remaining_ms(deadline: float | None, passed: str) -> int | None:
    """Milliseconds left until ``deadline`` (monotonic) for the next frame, None without one;
    DeadlineExceeded(``passed``) when none are left."""
    if deadline is None:
        return None
    left = int((deadline - time.monotonic()) * 1000)
    if left <= 0:
        raise DeadlineExceeded(passed)
    return left


class OutputStage(Protocol[S]):
    """What a shard does with its engine output, and what a session keeps for it."""

    def check(self, frame: StepFrame) -> None:
        """Refuse a frame whose route fields do not fit this stage (every frame)."""

    def check_opening(self, frame: StepFrame) -> None:
        """Refuse an opening frame that lacks what this stage needs (before admission)."""

    def open_state(self, frame: StepFrame, stream_deadline: float | None) -> S:
        """What the session keeps, made from its opening frame once it is admitted."""
        ...

    def rows(self, state: S, frame: StepFrame) -> Rows:
        """The rows of ``frame`` the engine runs to the end (``StepInput.want_logits``)."""
        ...

    def route_shards(self, state: S) -> int:
        """Shards from here to the end of the session's route (``StepInput.route_shards``)."""
        ...

    async def emit(
        self, state: S, frame: StepFrame, output: StepOutput, deadline: float | None, timing: HopTiming | None
    ) -> StepResult:
        """The answer to ``frame`` once this shard's layers have run it (``timing``: only for probes)."""
        ...

    async def release(self, state: S) -> None:
        """The session ended here: let go of what it kept."""


class SampleStage:
    """The model's last layers: sample the token that follows a final chunk.

    A session keeps a ``TailState``: its ``TailSampler`` (parameters, penalty counts, grammar
    state) and its ``RingMailbox``. ``grammars`` builds grammar matchers, None on a tail without
    a vocabulary to match against. A tail (``is_head`` False) answers a ring frame into the
    mailbox, which the head reads; a full shard is its own head and answers on its stream.
    """

    def __init__(self, grammars: GrammarVocabulary | None = None, *, is_head: bool) -> None:
        self._grammars = grammars
        self._is_head = is_head

    def check(self, frame: StepFrame) -> None:
        if frame.downstream:
            raise InvalidArgument("downstream hops belong only in the opening frame of a non-tail shard")

    def check_opening(self, frame: StepFrame) -> None:
        if frame.embedding is not None:
            return  # an embedding session samples nothing: its sampling parameters are not read
        if frame.sampling is None:
            raise InvalidArgument("the opening frame must carry the sampling parameters for the tail")
        if frame.sampling.constraint is not None and self._grammars is None:
            raise InvalidArgument("this tail has no vocabulary to apply a grammar with (response_format)")

    def open_state(self, frame: StepFrame, stream_deadline: float | None) -> TailState:
        self.check_opening(frame)
        if frame.embedding is not None:
            sampler = TailSampler(SamplingParams(), None)  # never asked: no token is sampled
            return TailState(sampler, frame.meta.request_id, RingMailbox(), frame.embedding)
        params = frame.sampling
        if params is None:  # check_opening refused it already; this tells the type checker
            raise InvalidArgument("the opening frame must carry the sampling parameters for the tail")
        constraint = params.constraint
        grammars = self._grammars
        matcher = None if constraint is None or grammars is None else grammars.matcher(constraint)
        sampler = TailSampler(params, matcher)
        if frame.snapshot is not None:
            # Resumed from a snapshot: the tokens chosen before it are counted, not sampled again.
            sampler.advance(frame.snapshot.sampled)
        return TailState(sampler, frame.meta.request_id, RingMailbox())

    def rows(self, state: TailState, frame: StepFrame) -> Rows:
        # Only a final chunk's last row is sampled from; earlier chunks need no logits at all. An
        # embedding's final chunk runs every row to the end, as llama.cpp's embedding contexts do,
        # so its last layer is the very computation whole-model llama.cpp pools (its last row
        # alone was equal too on the models measured, but one row may take other kernels).
        if not frame.final_chunk:
            return "none"
        return "normed" if state.embedding is not None else "last"

    def route_shards(self, state: TailState) -> int:
        return 1  # the route ends here

    async def emit(
        self, state: TailState, frame: StepFrame, output: StepOutput, deadline: float | None, timing: HopTiming | None
    ) -> StepResult:
        meta = frame.meta
        next_position = meta.position + frame.n_tokens
        token, logprobs, embedding = None, None, None
        if frame.final_chunk and state.embedding is not None:
            if output.normed is None:
                raise InvalidArgument(
                    "this swarm's tail cannot embed: its engine returns no final-norm rows "
                    "(an expert-parallel MoE tail, for one)"
                )
            # The final chunk's last row after the final norm, pooled.
            embedding = tuple(pool(output.normed, state.embedding).tolist())
        elif frame.final_chunk:
            # logits: [1, n_vocab], the row of the frame's last token (want_logits "last").
            if output.logits is None or len(output.logits) == 0:
                raise EngineError("the engine returned no logits for a final chunk at the tail")
            # Seeded by the position it fills, so a replay samples the same token again.
            token, logprobs = state.sampler.choose(output.logits[-1], next_position)
        timings = () if timing is None else (*frame.timings, timing)
        result = StepResult(
            meta.session_id, meta.step, next_position, token, timings, logprobs=logprobs, embedding=embedding
        )
        if frame.ring and not self._is_head:
            await state.ring.deliver(result)  # straight to the head; nothing goes back upstream
        return result

    async def release(self, state: TailState) -> None:
        state.sampler.close()
        state.ring.close()


class Continuation(Protocol):
    def steps(
        self, frame: StepFrame, result: StepResult, stream_deadline: float | None, run: RunStep
    ) -> AsyncIterator[StepResult]:
        """The results of the decode steps after ``frame`` that this shard runs by itself."""
        ...


class NoContinuation:
    """Shards after the head: every step comes from upstream."""

    async def steps(
        self, frame: StepFrame, result: StepResult, stream_deadline: float | None, run: RunStep
    ) -> AsyncIterator[StepResult]:
        return
        yield  # an async generator that yields nothing


class HeadDecodeLoop:
    """Head-driven decode: feed each sampled token back in as the next decode step.

    Each step is the ring frame the sender would have sent (same checks, same idempotency
    bookkeeping), so a sender can switch between driving and reading freely.
    """

    async def steps(
        self, frame: StepFrame, result: StepResult, stream_deadline: float | None, run: RunStep
    ) -> AsyncIterator[StepResult]:
        plan = frame.continuation
        if plan is None:
            return
        unsent: StepResult | None = None
        """The last step's answer, sent to the sender while the next step already runs."""
        running: asyncio.Task[StepResult] | None = None
        try:
            for offset in range(1, plan.max_steps + 1):
                if result.token_id is None or result.token_id in plan.stop_token_ids:
                    break
                meta = replace(
                    frame.meta,
                    phase="decode",
                    position=result.next_position,
                    step=frame.meta.step + offset,
                    cache="continue",
                    deadline_ms=remaining_ms(stream_deadline, "the session's deadline passed while decoding"),
                )
                tokens = np.array([result.token_id], np.int32)
                next_frame = StepFrame(meta=meta, tokens=tokens, ring=True, want_timings=frame.want_timings)
                computed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                running = asyncio.ensure_future(run(next_frame, computed))
                if unsent is not None:
                    # The sender's write waits until this step has left the engine (and its
                    # frame is on its way on): every thread of a shard may share one core, so
                    # the write costs the critical path nothing only while the next shards
                    # compute. Written earlier, it delays the step's start on the engine.
                    either: set[asyncio.Future[Any]] = {computed, running}
                    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                    yield unsent
                result = unsent = await running
                running = None
            if unsent is not None:
                yield unsent
        finally:
            if running is not None:
                running.cancel()
