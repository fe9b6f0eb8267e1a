"""The ring: a decode token goes from the tail straight back to the head.

A session's opening frame travels down the chain of shards and its answer back up it (the tail
holds the session only once that frame has reached it). Every frame after it is a ``ring`` frame
(a shard refuses any other): the head forwards it, each middle forwards it on without answering,
and the tail writes its answer into the session's ``RingMailbox``, which the head reads over a
``RingReturn`` stream it opened on the tail. A token crosses N seams on a route of N shards, where
answering back through each middle would cross 2(N-1).

A worker's decode frames and a tail's answers do not take one gRPC message each: every ring
frame a worker forwards to the same next hop in one engine step leaves in one ``StepBatch`` on a
RingBatch stream, and a tail writes the answers of one head's sessions made in one step as one
message on that head's RingReturnBatch stream (``route.ring_batch``); each session's own Session
stream stays its control and failure channel, and each row is handled as that stream's frame.

Prefill chunks after the opening one travel on the ring too, pipelined: the head answers a
non-final chunk as soon as it has forwarded it, so the sender sends the next one while the
later shards still run this one; at most ``MAX_CHUNKS_IN_FLIGHT`` chunks are unanswered by the
tail at any time (the head waits for the tail's ack of chunk c-K before forwarding chunk c).

Nothing about failure handling is lost by not answering: every forwarding shard keeps a watch on
its downstream stream (``RingLeg.watch``), which in ring mode only ever ends with the reason the
downstream failed; the head races its wait for the tail's answer against that watch and against
the step's deadline, and a middle's session stream (``node.session_stream``) races its next
upstream frame against it, so a lost hop ends the route's stream at the head at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from meshnet.core.embedding import EmbeddingSpec
from meshnet.core.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    IntegrityError,
    MeshnetError,
    Unavailable,
)
from meshnet.core.ids import UNKNOWN_INCARNATION, LegIncarnation, RequestId, SessionId, new_leg_incarnation
from meshnet.engine.tail_sampler import TailSampler
from meshnet.wire.batch_frames import LostRow
from meshnet.wire.frames import HopSpec, StepFrame, StepResult


class RingReader(Protocol):
    """The head's end of a ``RingReturn`` stream (``route.shard_stream.RingStream`` on the wire)."""

    async def read(self) -> StepResult: ...

    def cancel(self) -> None: ...


OpenRing = Callable[[HopSpec, SessionId, RequestId, float | None], RingReader]
"""Open the RingReturn stream of a session on the tail: (the tail's hop: its address, node id to pin
in the handshake and whether it takes ring batches; session, request, timeout in seconds) -> its
answers."""


class RingLink(Protocol):
    """What a forwarding shard needs of its downstream stream once the session runs a ring."""

    async def send(self, frame: StepFrame) -> None: ...

    async def read(self) -> StepResult: ...

    async def finish_writing(self) -> None: ...

    def cancel(self) -> None: ...


log = logging.getLogger(__name__)
_CLOSED = object()
MAX_CHUNKS_IN_FLIGHT = 2
"""Prefill chunks of a session forwarded by the head and not yet answered by the tail."""


WriteAnswer = Callable[[StepResult], Awaitable[None]]
"""Writes one answer onto the head's RingReturn stream."""


class RingMailbox:
    """On the tail: the answers of a session's ring frames, on their way to the head.

    Until the head's RingReturn stream is open and has caught up with the answers that came
    before it, answers wait in a queue; from then on each is written onto the stream at once by
    the step that made it, with no hop through the queue and the stream's own task (measured
    0.1 ms a token in the per-step trace). Failure and the end of the session still go through
    the queue, to the stream's handler.
    """

    def __init__(self) -> None:
        self._queue: asyncio.Queue[StepResult | MeshnetError | object] = asyncio.Queue()
        self._reader = False
        self._write: WriteAnswer | None = None
        """The head's stream, once it has every earlier answer."""

    async def deliver(self, result: StepResult) -> None:
        """Send ``result`` to the head (a session's steps deliver one at a time, in order)."""
        write = self._write
        if write is None:
            self._queue.put_nowait(result)
        elif not await _written(write, result):
            self._write = None

    def fail(self, error: MeshnetError) -> None:
        """The session failed here: the head learns why (its next read raises ``error``)."""
        self._queue.put_nowait(error)

    def close(self) -> None:
        self._queue.put_nowait(_CLOSED)

    async def serve(self, write: WriteAnswer) -> None:
        """Write every answer in step order with ``write`` until the session ends (returns) or
        fails here (raises why); one reader per session."""
        if self._reader:
            raise FailedPrecondition("this session's ring is already being read")
        self._reader = True
        try:
            while True:
                if self._queue.empty():
                    self._write = write  # caught up: later answers are written as they are made
                item = await self._queue.get()
                if item is _CLOSED:
                    return
                if isinstance(item, MeshnetError):
                    raise item
                if isinstance(item, StepResult) and not await _written(write, item):
                    return  # the stream is gone; the session's route goes with it
        finally:
            self._write = None


async def _written(write: WriteAnswer, result: StepResult) -> bool:
    """Whether ``write`` took ``result``: False once the head's stream is gone (and with it the
    session's route, which its upstream stream's end then tears down)."""
    try:
        await write(result)
    except Exception as error:
        log.debug("ring answer %d not delivered: %s", result.step, error)
        return False
    return True


@dataclass(frozen=True)
class TailState:
    """What a sampling shard keeps per session: its sampler (parameters, penalty counts, grammar
    state), and where ring answers go."""

    sampler: TailSampler
    request_id: RequestId
    ring: RingMailbox
    embedding: EmbeddingSpec | None = None
    """An embedding session: its final chunk is pooled (``engine.pooling``), nothing sampled."""


def loses_row(lost: LostRow, own: LegIncarnation, batched_step: int, answered_through: int) -> bool:
    """Whether ``lost`` ends the leg of incarnation ``own``: the row must be this leg's (or say
    nothing of whose it is: an older receiver), and not one the tail has answered already (a
    head's ``answered_through``; -1 on a middle, which hears no answers).

    A session id can be opened again on this shard (a failover's newer route, a retry) while a
    refusal of the old leg's row is still on its way: matched on the step alone, it would fail
    the new leg whenever the steps line up."""
    if lost.incarnation not in (UNKNOWN_INCARNATION, own):
        return False
    step = batched_step if lost.step is None else lost.step
    return answered_through < step


class RingLeg:
    """On a forwarding shard: the ring side of one session's downstream link, for one opening of
    the session here (``incarnation``: a new draw per opening, unless a test names one)."""

    def __init__(self, incarnation: LegIncarnation | None = None) -> None:
        self.incarnation = new_leg_incarnation() if incarnation is None else incarnation
        """Tags each ring row this leg sends in a batch; a refusal echoes it (``loses_row``)."""
        self.watch: asyncio.Task[StepResult] | None = None
        """Reads the downstream stream, which on a ring only ends with why the downstream stopped."""
        self.back: RingReader | None = None
        """Head only: the tail's RingReturn stream."""
        self.answered_through = -1
        """Head only: the highest step the tail has answered on the ring."""
        self.batched_step = -1
        """The step of the last ring row this shard sent on in a batch (``route.ring_batch``)."""
        self._lost: MeshnetError | None = None
        """Why a ring row of this session is lost on its way to the next hop (``row_lost``)."""

    def start(self, link: RingLink) -> None:
        if self.watch is None:
            self.watch = asyncio.ensure_future(self._watched(link))
            # The watch ends with an error whenever the downstream stream ends, a clean end
            # included. A session torn down without ``close`` (its stream ended from the other
            # side) would leave that error unread, and asyncio would log the session as "Task
            # exception was never retrieved"; ``failure`` still reads it.
            self.watch.add_done_callback(_observe)

    async def _watched(self, link: RingLink) -> StepResult:
        try:
            return await link.read()
        except asyncio.CancelledError:
            if self._lost is None:
                raise
            raise self._lost from None

    def row_lost(self, lost: LostRow, error: MeshnetError) -> None:
        """A ring row (``lost.step``; None: the last one batched) did not reach the next hop, or
        may not have (refused there, or its batch stream broke with it unanswered): end the
        session's downstream with ``error`` now, as a lost hop ends it, rather than leave the
        session waiting for its step deadline.

        Nothing is lost for a row of another incarnation of the session, or for a head whose
        tail has already answered that step (the row arrived): ``loses_row``."""
        if self.watch is None or self.watch.done() or self._lost is not None:
            return
        if not loses_row(lost, self.incarnation, self.batched_step, self.answered_through):
            return
        self._lost = error
        self.watch.cancel()  # the watch ends with ``error``; the downstream stream is cancelled with it

    def failure(self) -> MeshnetError | None:
        """Why the downstream ended, once it has (None while it runs)."""
        if self.watch is None or not self.watch.done():
            return None
        return watch_error(self.watch)

    async def answer(self, step: int, deadline: float | None) -> StepResult:
        """The tail's answer to ``step``, or why it cannot come (a failed hop, the deadline)."""
        while True:
            result = await self._read(deadline)
            if result.step == step:
                return result
            if result.step > step:
                raise IntegrityError(f"the tail answered step {result.step} while the head waits for {step}")
            # An answer to an earlier step (a prefill chunk's ack, a repeat): already handled.

    async def acknowledged(self, step: int, deadline: float | None) -> None:
        """Wait until the tail has answered ``step`` (flow control of pipelined prefill chunks)."""
        while self.answered_through < step:
            await self._read(deadline)

    async def _read(self, deadline: float | None) -> StepResult:
        if self.back is None or self.watch is None:
            raise FailedPrecondition("the ring of this session is not open")
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise DeadlineExceeded("the step's deadline passed waiting for the tail's answer")
        read = asyncio.ensure_future(self.back.read())
        done, _ = await asyncio.wait({read, self.watch}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        if read not in done:
            read.cancel()
            if self.watch in done:
                raise watch_error(self.watch)
            raise DeadlineExceeded("the step's deadline passed waiting for the tail's answer")
        result = read.result()
        self.answered_through = max(self.answered_through, result.step)
        return result

    async def close(self, link: RingLink) -> None:
        """End the downstream stream (the next shard releases the session) and the ring."""
        if self.back is not None:
            self.back.cancel()
        if self.watch is None:
            return
        try:
            await link.finish_writing()
            # The downstream ends its side once it has released the session; wait briefly for that.
            await asyncio.wait({self.watch}, timeout=1.0)
        finally:
            # Even when this wait is cancelled (the upstream gives up on this shard as this shard
            # gives up on the next, after the same grace): a link left open would keep the
            # session on a next shard that is hung in a step, and its KV with it, for good.
            self.watch.cancel()
            link.cancel()


def _observe(watch: asyncio.Task[StepResult]) -> None:
    if not watch.cancelled():
        watch.exception()


def watch_error(watch: asyncio.Task[StepResult]) -> MeshnetError:
    """The reason a downstream stream in ring mode ended (a stray answer is a protocol error)."""
    if watch.cancelled():
        return Unavailable("the downstream link of this session was closed")
    error = watch.exception()
    if isinstance(error, MeshnetError):
        return error
    if error is not None:
        return Unavailable(f"the downstream link failed: {error}")
    return IntegrityError("a shard answered a ring frame upstream instead of on the ring")
