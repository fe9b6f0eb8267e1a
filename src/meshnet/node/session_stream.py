"""One Session stream on a shard, without its transport: the loop the servicer runs for each
stream (``servicer.py`` adds the wire and the security checks), run in process by the unit tests.

A session lives exactly as long as its stream: when the upstream closes, cancels, or a frame
fails, the session's KV is freed here and the downstream stream is closed, which frees it on
every later shard in turn. A shard after the head answers its ring frames round the ring or not
at all, so nothing comes back up this stream for them: ``next_frame`` races the upstream's next
frame against the shard's watch on its downstream, and a failure further down the route ends
this stream at once instead of at the session's next frame.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TypeVar

from meshnet.core.errors import InvalidArgument, MeshnetError
from meshnet.core.ids import SessionId
from meshnet.node.ring import watch_error
from meshnet.node.shard import AnyShard
from meshnet.wire.frames import StepFrame, StepResult

log = logging.getLogger(__name__)
M = TypeVar("M")


class SessionStream:
    """The session one stream carries on ``shard``, and the stream's deadline (monotonic)."""

    def __init__(self, shard: AnyShard, stream_deadline: float | None, opener: str | None = None) -> None:
        self._shard = shard
        self._deadline = stream_deadline
        self._opener = opener
        """The certificate (node id) on the other end of the stream; None: nobody is checked."""
        self.session_id: SessionId | None = None
        """Set once a frame of this stream succeeded: only then does the session belong to it."""
        self.epoch: int | None = None
        """The route epoch the session was opened on: a newer route may take the id over here."""

    async def next_frame(self, frames: AsyncIterator[M]) -> M | None:
        """The next upstream frame (None at the end of the stream); raises why the downstream
        ended as soon as it does, on a shard whose session runs a ring."""
        watch = None if self.session_id is None else self._shard.ring_watch(self.session_id)
        if watch is None:
            return await anext(frames, None)
        following = asyncio.ensure_future(anext(frames, None))
        await asyncio.wait({following, watch}, return_when=asyncio.FIRST_COMPLETED)
        if following.done():
            return following.result()
        following.cancel()
        raise watch_error(watch)

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
