"""The ring's data plane: one RingBatch stream per next hop carries every session's ring frames,
and one RingReturnBatch stream per tail brings the tail's answers back to the head.

A forwarding shard sends a session's decode frames here instead of on the session's own Session
stream (which stays open as its control and failure channel): the rows of one engine step that
go to the same next hop leave as one ``StepBatch`` (``route.coalescer``), so a seam costs one
gRPC message per step, not one per session. Prefill chunks stay on the session's own stream: a
batch of them could outgrow a message, and they are one per session anyway.

No row is left to its session's step deadline. The next hop answers only the rows it refuses
(no session of that id here, or not opened by this sender), naming each row's session, step and
the incarnation of the leg that sent it (echoed from the row): that leg fails at once
(``RowOwner.row_lost``), as on a lost link, and a leg opened later under the same session id
ignores it. A batch stream that breaks
fails the rows being written on it, and every session whose last row went into it: nothing says
whether the next hop took that row (a row is only ever the session's one in flight: the head sends
the next step once the tail answered this one), and a session whose row was lost would wait for
an answer that never comes. A head that has its answer already is left alone. The next row opens
a new stream. A next hop that does not serve RingBatch (an older worker that advertised it
anyway: the others are never sent batches, ``core.features.RING_BATCH``) is remembered, and its
sessions' frames go on their own streams from then on.

The head subscribes each session whose ring it reads on its one RingReturnBatch stream to that
session's tail; the tail writes the answers of one engine step in one message, and a session's
ring that ends there ends only its subscription. A return stream that breaks fails the rings of
every session on it (their reads raise, as a lost RingReturn stream's did).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Awaitable, Sequence
from typing import Protocol

import grpc
import grpc.aio

from meshnet.core.errors import MeshnetError, Unavailable
from meshnet.core.ids import LegIncarnation, RequestId, SessionId
from meshnet.route.coalescer import Coalescer, SeamCount
from meshnet.route.shard_stream import ChannelPool, RingStream
from meshnet.wire.batch_frames import LostRow, RingEnded
from meshnet.wire.batch_wire import (
    MAX_BATCH_ROWS,
    answers_from_proto,
    batch_to_proto,
    refused_from_proto,
    subscribe_to_proto,
)
from meshnet.wire.frames import HopSpec, StepFrame, StepResult
from meshnet.wire.status import error_for_code, error_from_rpc

log = logging.getLogger(__name__)


class RowOwner(Protocol):
    """Whoever sent a row (``node.ring.RingLeg``): told at once when the row is, or may be, lost.

    ``incarnation`` tags each row it sends and comes back in a refusal of that row: a session id
    can be opened again (a failover, a retry) and its new leg take the id's place in ``Owners``,
    so a late refusal of the old leg's row reaches the new one, which must ignore it."""

    @property
    def incarnation(self) -> LegIncarnation: ...

    def row_lost(self, lost: LostRow, error: MeshnetError) -> None: ...


Owners = weakref.WeakValueDictionary[str, RowOwner]
"""The sender of each session's last row on one batch stream (held weakly: a session that ended
leaves by itself)."""


class BatchLink:
    """The batch stream to one next hop (its address and pinned node id), opened on first use."""

    def __init__(self, pool: ChannelPool, address: str, node_id: str | None, seams: SeamCount) -> None:
        self._pool = pool
        self.address = address
        self._node_id = node_id
        self._seams = seams
        self._coalescer = Coalescer[tuple[StepFrame, RowOwner]](self._write, MAX_BATCH_ROWS)
        self._call: grpc.aio.StreamStreamCall | None = None
        self._owners: Owners = weakref.WeakValueDictionary()
        """Who sent each session's last row on ``_call``."""
        self._acks: asyncio.Task[None] | None = None
        self.unsupported = False
        """The next hop answered UNIMPLEMENTED: it is older than RingBatch."""

    async def send(self, frame: StepFrame, owner: RowOwner) -> None:
        """Send ``frame`` in the next batch; ``owner`` hears if it is refused or lost after that."""
        await self._coalescer.send((frame, owner))

    async def _write(self, rows: Sequence[tuple[StepFrame, RowOwner]]) -> None:
        call = self._call if self._call is not None else self._open()
        owners = self._owners
        for frame, owner in rows:
            owners[frame.meta.session_id] = owner
        try:
            await call.write(batch_to_proto([(frame, owner.incarnation) for frame, owner in rows]))
        except (grpc.RpcError, asyncio.InvalidStateError):
            self._drop(call, "broke")
            raise Unavailable(f"the ring batch stream to {self.address} broke") from None
        self._seams.add(len(rows))

    def _open(self) -> grpc.aio.StreamStreamCall:
        # No timeout: the stream outlives any one session; each row carries its own deadline.
        call = self._pool.stub(self.address, self._node_id).RingBatch()
        self._call, self._owners = call, weakref.WeakValueDictionary()
        self._acks = asyncio.ensure_future(self._read_acks(call, self._owners))
        return call

    async def _read_acks(self, call: grpc.aio.StreamStreamCall, owners: Owners) -> None:
        """Fail the session of each row the next hop refused; forget the stream once it ends."""
        how = "ended"
        try:
            async for ack in call:
                for refused in refused_from_proto(ack):
                    owner = owners.get(refused.session_id)
                    why = f"{self.address} refused the session's ring row of step {refused.step}: {refused.reason}"
                    log.info("%s (session %s)", why, refused.session_id)
                    if owner is not None:
                        owner.row_lost(LostRow(refused.step, refused.incarnation), Unavailable(why))
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                self.unsupported = True
                how = "was not served (an older worker)"
            elif error.code() != grpc.StatusCode.CANCELLED:
                how = f"broke: {error.details()}"
                log.info("the ring batch stream to %s %s", self.address, how)
        finally:
            self._drop(call, how)

    def _drop(self, call: grpc.aio.StreamStreamCall, how: str) -> None:
        """The stream is gone: fail each session whose last row went into it (``row_lost``)."""
        call.cancel()
        if self._call is not call:
            return
        owners, self._call, self._owners = self._owners, None, weakref.WeakValueDictionary()
        why = Unavailable(f"the ring batch stream to {self.address} {how} with this session's row unanswered")
        for owner in list(owners.values()):
            owner.row_lost(LostRow(None, owner.incarnation), why)

    async def close(self) -> None:
        if self._call is not None:
            self._drop(self._call, "was closed: the worker is shutting down")
        if self._acks is not None:
            self._acks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._acks


class RingAnswers:
    """The head's end of one session's ring on a shared RingReturnBatch stream (``RingReader``)."""

    def __init__(self, link: ReturnLink, session_id: SessionId) -> None:
        self._link = link
        self.session_id = session_id
        self._answers: asyncio.Queue[StepResult | MeshnetError] = asyncio.Queue()

    def put(self, item: StepResult | MeshnetError) -> None:
        self._answers.put_nowait(item)

    async def read(self) -> StepResult:
        item = await self._answers.get()
        if isinstance(item, MeshnetError):
            self._answers.put_nowait(item)  # every later read fails the same way
            raise item
        return item

    def cancel(self) -> None:
        self._link.forget(self)


class ReturnLink:
    """The RingReturnBatch stream to one tail, opened on first use."""

    def __init__(self, pool: ChannelPool, address: str, node_id: str | None) -> None:
        self._pool = pool
        self.address = address
        self._node_id = node_id
        self._subscriptions = Coalescer[tuple[SessionId, RequestId]](self._subscribe, MAX_BATCH_ROWS)
        self._readers: dict[str, RingAnswers] = {}
        self._call: grpc.aio.StreamStreamCall | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.unsupported = False
        """The tail answered UNIMPLEMENTED: it is older than RingReturnBatch."""

    def open(self, session_id: SessionId, request_id: RequestId) -> RingAnswers:
        reader = self._readers[session_id] = RingAnswers(self, session_id)
        self._spawn(self._subscribe_one(reader, request_id))
        return reader

    def forget(self, reader: RingAnswers) -> None:
        if self._readers.get(reader.session_id) is reader:
            del self._readers[reader.session_id]

    async def _subscribe_one(self, reader: RingAnswers, request_id: RequestId) -> None:
        try:
            await self._subscriptions.send((reader.session_id, request_id))
        except MeshnetError as error:
            reader.put(error)

    async def _subscribe(self, sessions: Sequence[tuple[SessionId, RequestId]]) -> None:
        call = self._call if self._call is not None else self._open()
        try:
            await call.write(subscribe_to_proto(sessions))
        except (grpc.RpcError, asyncio.InvalidStateError):
            self._drop(call, Unavailable(f"the ring return stream from {self.address} broke"))
            raise Unavailable(f"the ring return stream from {self.address} broke") from None

    def _open(self) -> grpc.aio.StreamStreamCall:
        call = self._pool.stub(self.address, self._node_id).RingReturnBatch()
        self._call = call
        self._spawn(self._read_answers(call))
        return call

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read_answers(self, call: grpc.aio.StreamStreamCall) -> None:
        ended: MeshnetError = Unavailable(f"the tail {self.address} closed the ring return stream")
        try:
            async for message in call:
                self._deliver(*answers_from_proto(message))
        except grpc.RpcError as error:
            self.unsupported = error.code() == grpc.StatusCode.UNIMPLEMENTED
            ended = error_from_rpc(error)
        finally:
            self._drop(call, ended)

    def _deliver(self, answers: tuple[StepResult, ...], ended: tuple[RingEnded, ...]) -> None:
        for answer in answers:
            reader = self._readers.get(answer.session_id)
            if reader is not None:
                reader.put(answer)
        for end in ended:
            reader = self._readers.pop(end.session_id, None)
            if reader is not None:
                reader.put(error_for_code(end.code, end.message))

    def _drop(self, call: grpc.aio.StreamStreamCall, why: MeshnetError) -> None:
        """The stream is gone: so is every ring read on it."""
        call.cancel()
        if self._call is not call:
            return
        self._call = None
        readers, self._readers = list(self._readers.values()), {}
        for reader in readers:
            reader.put(why)

    async def close(self) -> None:
        if self._call is not None:
            self._drop(self._call, Unavailable("the worker is shutting down"))
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class RingLinks:
    """A worker's ring batch streams: one per next hop for ring frames, one per tail for answers,
    and the count of what they sent."""

    def __init__(self, pool: ChannelPool, seams: SeamCount) -> None:
        self._pool = pool
        self._seams = seams
        self._links: dict[tuple[str, str], BatchLink] = {}
        self._returns: dict[tuple[str, str], ReturnLink] = {}

    async def send(self, address: str, node_id: str | None, frame: StepFrame, owner: RowOwner) -> bool:
        """Send ``frame`` in the next batch to ``address``; False where that hop takes no batches
        (the caller sends it on the session's own stream). ``owner`` hears if the row is lost."""
        key = (address, node_id or "")
        link = self._links.get(key)
        if link is None:
            link = self._links[key] = BatchLink(self._pool, address, node_id, self._seams)
        if link.unsupported:
            return False
        await link.send(frame, owner)
        return True

    def open_ring(
        self, tail: HopSpec, session_id: SessionId, request_id: RequestId, timeout: float | None
    ) -> RingAnswers | RingStream:
        """Read a session's ring answers from ``tail`` (``node.ring.OpenRing``): on the shared
        return stream, or on a RingReturn stream of its own where the tail is older (it did not
        advertise ring batches, or answered UNIMPLEMENTED all the same)."""
        address, node_id = tail.address, tail.node_id or None
        key = (address, tail.node_id)
        link = self._returns.get(key) if tail.ring_batch else None
        if link is None and tail.ring_batch:
            link = self._returns[key] = ReturnLink(self._pool, address, node_id)
        if link is None or link.unsupported:
            return RingStream(self._pool, address, session_id, request_id, timeout, node_id)
        return link.open(session_id, request_id)

    async def close(self) -> None:
        closing = [link.close() for link in self._links.values()]
        closing += [link.close() for link in self._returns.values()]
        self._links, self._returns = {}, {}
        await asyncio.gather(*closing, return_exceptions=True)
