"""The ring's data plane: one RingBatch stream per next hop carries every session's ring frames.

A forwarding shard sends a session's decode frames here instead of on the session's own Session
stream (which stays open as its control and failure channel): the rows of one engine step that
go to the same next hop leave as one ``StepBatch`` (``route.coalescer``), so a seam costs one
gRPC message per step, not one per session. Prefill chunks stay on the session's own stream: a
batch of them could outgrow a message, and they are one per session anyway.

A batch stream that breaks fails the rows being written on it (their sessions fail as on a lost
link); rows already written into it are lost with it, and their sessions learn it from their own
Session stream's watch or their step's deadline, as on any lost hop. The next row opens a new
stream. A next hop that does not serve RingBatch (an older worker) is remembered, and its
sessions' frames go on their own streams from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import grpc
import grpc.aio

from meshnet.core.errors import Unavailable
from meshnet.route.coalescer import Coalescer, SeamCount
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire.batch_wire import MAX_BATCH_ROWS, batch_to_proto, refused_from_proto
from meshnet.wire.frames import StepFrame

log = logging.getLogger(__name__)


class BatchLink:
    """The batch stream to one next hop (its address and pinned node id), opened on first use."""

    def __init__(self, pool: ChannelPool, address: str, node_id: str | None, seams: SeamCount) -> None:
        self._pool = pool
        self.address = address
        self._node_id = node_id
        self._seams = seams
        self._coalescer = Coalescer[StepFrame](self._write, MAX_BATCH_ROWS)
        self._call: grpc.aio.StreamStreamCall | None = None
        self._acks: asyncio.Task[None] | None = None
        self.unsupported = False
        """The next hop answered UNIMPLEMENTED: it is older than RingBatch."""

    async def send(self, frame: StepFrame) -> None:
        await self._coalescer.send(frame)

    async def _write(self, frames: Sequence[StepFrame]) -> None:
        call = self._call if self._call is not None else self._open()
        try:
            await call.write(batch_to_proto(frames))
        except (grpc.RpcError, asyncio.InvalidStateError):
            self._drop(call)
            raise Unavailable(f"the ring batch stream to {self.address} broke") from None
        self._seams.add(len(frames))

    def _open(self) -> grpc.aio.StreamStreamCall:
        # No timeout: the stream outlives any one session; each row carries its own deadline.
        call = self._pool.stub(self.address, self._node_id).RingBatch()
        self._call = call
        self._acks = asyncio.ensure_future(self._read_acks(call))
        return call

    async def _read_acks(self, call: grpc.aio.StreamStreamCall) -> None:
        """Log the rows the next hop refused; forget the stream once it ends."""
        try:
            async for ack in call:
                for refused in refused_from_proto(ack):
                    log.info(
                        "%s refused ring row %s/%d: %s",
                        self.address,
                        refused.session_id,
                        refused.step,
                        refused.reason,
                    )
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                self.unsupported = True
            elif error.code() != grpc.StatusCode.CANCELLED:
                log.info("the ring batch stream to %s ended: %s", self.address, error.details())
        finally:
            self._drop(call)

    def _drop(self, call: grpc.aio.StreamStreamCall) -> None:
        if self._call is call:
            self._call = None
        call.cancel()

    async def close(self) -> None:
        if self._call is not None:
            self._drop(self._call)
        if self._acks is not None:
            self._acks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._acks


class BatchLinks:
    """A worker's batch streams, one per next hop, and the count of what they sent."""

    def __init__(self, pool: ChannelPool, seams: SeamCount) -> None:
        self._pool = pool
        self._seams = seams
        self._links: dict[tuple[str, str], BatchLink] = {}

    async def send(self, address: str, node_id: str | None, frame: StepFrame) -> bool:
        """Send ``frame`` in the next batch to ``address``; False where that hop takes no batches
        (the caller sends it on the session's own stream)."""
        key = (address, node_id or "")
        link = self._links.get(key)
        if link is None:
            link = self._links[key] = BatchLink(self._pool, address, node_id, self._seams)
        if link.unsupported:
            return False
        await link.send(frame)
        return True

    async def close(self) -> None:
        links, self._links = list(self._links.values()), {}
        await asyncio.gather(*(link.close() for link in links), return_exceptions=True)
