"""One Session stream on a shard, without its transport: the loop the servicer runs for each
stream (``servicer.py`` adds the wire and the security checks), run in process by the unit tests.

A session lives exactly as long as its stream: when the upstream closes, cancels, or a frame
fails, the session's KV is freed here and the downstream stream is closed, which frees it on
every later shard in turn. A shard after the head answers its ring frames round the ring or not
at all, so nothing comes back up this stream for them: ``next_frame`` races the upstream's next
frame against the shard's watch on its downstream, and a failure further down the route ends
this stream at once instead of at the session's next frame.

Once its session is open, a stream also takes the session's rows of ring batches
(``Shard.RingBatch``, dispatched by the servicer with ``offer``): a row is handled exactly as a
frame of the stream itself, so its checks, its idempotency and its failure (which ends this
stream with the typed error, and only this one) are the stream's own.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Generic, TypeVar

from meshnet.core.errors import InvalidArgument, MeshnetError
from meshnet.core.ids import SessionId
from meshnet.node.ring import watch_error
from meshnet.node.shard import AnyShard
from meshnet.wire.frames import StepFrame, StepResult

log = logging.getLogger(__name__)
M = TypeVar("M")


class SessionStream(Generic[M]):
    """The session one stream carries on ``shard``, and the stream's deadline (monotonic).

    ``opener``: the node id of the stream's sender (its certificate's), which the session's route
    ticket must name; None on an unsecured shard."""

    def __init__(self, shard: AnyShard, stream_deadline: float | None, opener: str | None = None) -> None:
        self._shard = shard
        self._deadline = stream_deadline
        self._opener = opener
        self._rows: deque[M] = deque()
        """Ring batch rows of this session, in the order its upstream sent them."""
        self._woken: asyncio.Future[None] | None = None
        """While ``next_frame`` waits: set by whichever comes first (a row, the upstream's next
        frame, the downstream's end). A row wakes the stream's task directly, in the loop turn
        its batch arrived in: no task per row (an ``asyncio.Queue`` getter task per step cost
        three loop turns and a cancellation per row, and spread one batch's sessions over turns,
        so their rows to the next hop left in several messages)."""
        self._following: asyncio.Future[M | None] | None = None
        """The upstream's next frame, asked for while rows are awaited too (kept across calls)."""
        self.session_id: SessionId | None = None
        """Set once a frame of this stream succeeded: only then does the session belong to it."""
        self.epoch: int | None = None
        """The route epoch the session was opened on: a newer route may take the id over here."""

    @property
    def opener(self) -> str | None:
        """The node id of the session's upstream (None unsecured): the only sender of its rows."""
        return self._opener

    def offer(self, row: M) -> None:
        """A ring batch row of this stream's session, handled as its next frame."""
        self._rows.append(row)
        _wake(self._woken)

    async def next_frame(self, frames: AsyncIterator[M]) -> M | None:
        """The next upstream frame or batch row (None at the end of the stream); raises why the
        downstream ended as soon as it does, on a shard whose session runs a ring."""
        if self._rows:
            return self._rows.popleft()
        watch = None if self.session_id is None else self._shard.ring_watch(self.session_id)
        if self.session_id is None and self._following is None:
            return await anext(frames, None)  # the opening frame: no rows before it
        if self._following is None:
            self._following = asyncio.ensure_future(anext(frames, None))
        await self._first_of(self._following, watch)
        if self._rows:
            return self._rows.popleft()
        if self._following.done():
            following, self._following = self._following, None
            return following.result()
        raise watch_error(watch) if watch is not None else InvalidArgument("the session stream stopped")

    async def _first_of(self, following: asyncio.Future[M | None], watch: asyncio.Future[Any] | None) -> None:
        """Until a row is offered, ``following`` is done or ``watch`` is (whichever is first)."""
        waits = [f for f in (following, watch) if f is not None]
        if any(f.done() for f in waits):
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake(_: object) -> None:
            _wake(woken)

        for future in waits:
            future.add_done_callback(wake)
        self._woken = woken
        try:
            await woken
        finally:
            self._woken = None
            for future in waits:
                future.remove_done_callback(wake)

    async def run(self, frame: StepFrame) -> StepResult:
        """Run one frame of this stream's session on the shard."""
        if self.session_id is not None and frame.meta.session_id != self.session_id:
            raise InvalidArgument("one stream carries one session; open a new stream for another")
        result = await self._shard.handle(frame, self._deadline, self._opener)
        self.session_id, self.epoch = frame.meta.session_id, frame.meta.route_epoch
        return result

    async def answers(self, frame: StepFrame, result: StepResult) -> AsyncIterator[StepResult]:
        """What goes back up the stream once ``frame`` ran with ``result``: the result itself
        unless it goes round the ring, then each step the head decodes on by itself."""
        if self._shard.answer_upstream(frame):
            yield result
        if frame.continuation is None:
            return  # nothing for the head to run by itself (every frame but the last)
        async for continued in self._shard.continue_decoding(frame, result, self._deadline):
            yield continued

    async def end(self, failure: MeshnetError | None) -> None:
        """The stream ended (``failure``: why it failed): tell the head reading this tail's ring
        why, and free the session here, which closes its stream down the route."""
        if self._following is not None:
            self._following.cancel()
        key = self.session_id
        if key is None:
            return
        if failure is not None:
            self._shard.fail_ring(key, failure, epoch=self.epoch)
        reason = "stream ended" if failure is None else f"stream failed: {failure.code}"
        try:
            await self._shard.end(key, reason, epoch=self.epoch)
        except MeshnetError:
            log.exception("releasing session %s failed", key)


def _wake(woken: asyncio.Future[None] | None) -> None:
    if woken is not None and not woken.done():
        woken.set_result(None)
