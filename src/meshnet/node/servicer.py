"""The gRPC Shard servicer: wire adaptation and who may do what; decisions live in ``Shard``,
and a Session stream's life in ``SessionStream`` (``session_stream.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from functools import partial

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from meshnet.core.errors import InvalidArgument, MeshnetError, PermissionDenied, ResourceExhausted, Unavailable
from meshnet.core.ids import SessionId
from meshnet.node.ring_rows import row_refusal
from meshnet.node.session_stream import SessionStream
from meshnet.node.shard import AnyShard
from meshnet.route.coalescer import Coalescer
from meshnet.security.identity import PeerIdentity
from meshnet.security.policy import authorize_opening, authorize_shard
from meshnet.wire import services as pb
from meshnet.wire.batch_frames import RefusedRow, RingEnded
from meshnet.wire.batch_wire import (
    MAX_BATCH_ROWS,
    answers_to_proto,
    batch_rows,
    refused_to_proto,
    row_epoch,
    row_incarnation,
    row_session,
    row_step,
    subscribed,
)
from meshnet.wire.frames import StepResult
from meshnet.wire.kv_wire import held_kv_from_proto, held_snapshots_from_proto
from meshnet.wire.shard_wire import (
    cancel_reply_to_proto,
    capability_to_proto,
    frame_from_proto,
    metrics_to_proto,
    release_reply_to_proto,
    result_to_proto,
    ring_open_from_proto,
    session_end_from_proto,
)
from meshnet.wire.status import abort_with
from meshnet.wire.tls import LinkSecurity, enforce

log = logging.getLogger(__name__)


class ShardServicer(pb.ShardServicer):
    def __init__(self, shard: AnyShard, security: LinkSecurity | None = None) -> None:
        self.shard = shard
        self._security = security
        """None only on a loopback development worker (``--insecure``): then nobody is checked."""
        self._openers: dict[SessionId, tuple[str, int]] = {}
        """Who opened each live session (its stream's peer), on which route epoch: the only party
        that may end it, or open it again, unless a newer route takes it over."""
        self._streams: dict[str, SessionStream[pb.StepRequest]] = {}
        """The stream of each session open here: where its ring batch rows go."""

    async def _admit(
        self, context: grpc.aio.ServicerContext, rpc: str, session_id: SessionId | None = None
    ) -> PeerIdentity | None:
        """The caller if ``rpc`` is allowed to it; aborts the call otherwise (None: nobody is checked)."""
        if self._security is None:
            return None
        try:
            peer = self._security.peer(context)
            held = self._openers.get(session_id) if session_id is not None else None
            opener = None if held is None else held[0]
            revoked = self._security.revocations.current()
            enforce(authorize_shard(peer, rpc, session_opener=opener, revoked=revoked))
        except MeshnetError as error:
            await abort_with(context, error)
        return peer

    async def GetCapability(self, request: pb.CapabilityRequest, context: grpc.aio.ServicerContext) -> pb.Capability:
        await self._admit(context, "GetCapability")
        return capability_to_proto(self.shard.capability())

    async def GetMetrics(self, request: pb.MetricsRequest, context: grpc.aio.ServicerContext) -> pb.MetricsSnapshot:
        await self._admit(context, "GetMetrics")
        return metrics_to_proto(self.shard.metrics().values())

    async def HeldKv(self, request: pb.HeldKvRequest, context: grpc.aio.ServicerContext) -> pb.HeldKvReply:
        await self._admit(context, "HeldKv")
        try:
            fingerprint, chain = held_kv_from_proto(request)
        except MeshnetError as error:
            await abort_with(context, error)
        return pb.HeldKvReply(blocks=self.shard.held_kv(fingerprint, chain))

    async def KeepSnapshot(
        self, request_iterator: AsyncIterator[pb.SnapshotPiece], context: grpc.aio.ServicerContext
    ) -> pb.SnapshotKept:
        await self._admit(context, "KeepSnapshot")
        snapshots = self.shard.kv.snapshots
        if not snapshots.disk.enabled:
            return pb.SnapshotKept(kept=False)  # this worker keeps no snapshots (--snapshot-every 0)
        try:
            data = await _joined(request_iterator, snapshots.disk.budget_bytes)
            return pb.SnapshotKept(kept=await snapshots.keep_copy(data))
        except MeshnetError as error:
            await abort_with(context, error)

    async def HeldSnapshots(
        self, request: pb.HeldSnapshotsRequest, context: grpc.aio.ServicerContext
    ) -> pb.HeldSnapshotsReply:
        await self._admit(context, "HeldSnapshots")
        try:
            fingerprint, session_id = held_snapshots_from_proto(request)
        except MeshnetError as error:
            await abort_with(context, error)
        return pb.HeldSnapshotsReply(positions=self.shard.kv.snapshots.held(fingerprint, session_id))

    async def Release(self, request: pb.ReleaseRequest, context: grpc.aio.ServicerContext) -> pb.ReleaseResponse:
        return release_reply_to_proto(await self._end(request, context, "Release", "released"))

    async def Cancel(self, request: pb.CancelRequest, context: grpc.aio.ServicerContext) -> pb.CancelResponse:
        return cancel_reply_to_proto(await self._end(request, context, "Cancel", "cancelled"))

    async def _end(
        self,
        request: pb.ReleaseRequest | pb.CancelRequest,
        context: grpc.aio.ServicerContext,
        rpc: str,
        default_reason: str,
    ) -> bool:
        try:
            end = session_end_from_proto(request)
        except MeshnetError as error:
            await abort_with(context, error)
        await self._admit(context, rpc, end.session_id)
        return await self.shard.end(end.session_id, end.reason or default_reason)

    def _check_owner(self, key: SessionId, epoch: int, opener: str | None) -> None:
        """A session held here belongs to the party that opened it; only an opening frame of a
        newer route epoch may take its id over (``Shard._supersede``: the failover of its route)."""
        held = self._openers.get(key)
        if held is not None and held[0] != opener and epoch <= held[1]:
            raise PermissionDenied("this session belongs to another party")

    async def RingReturn(self, request: pb.RingOpen, context: grpc.aio.ServicerContext) -> None:
        # Only a swarm worker (the route's head) reads a ring; the request id it must name is
        # known only to the route's own shards. A coroutine writing with ``context.write`` (not
        # a generator) so the tail's steps can write their answers themselves (``RingMailbox``).
        await self._admit(context, "RingReturn")
        try:
            session_id, request_id = ring_open_from_proto(request)
            mailbox = self.shard.ring_mailbox(session_id, request_id)
            await mailbox.serve(lambda result: self._answer(context, result))
        except MeshnetError as error:
            await abort_with(context, error)

    async def _answer(self, context: grpc.aio.ServicerContext, result: StepResult) -> None:
        await context.write(result_to_proto(result))
        self.shard.seams.add(1)

    async def RingReturnBatch(
        self, request_iterator: AsyncIterator[pb.RingSubscribe], context: grpc.aio.ServicerContext
    ) -> None:
        # One stream per head: the answers of its sessions made in one engine step leave in one
        # message (``route.coalescer``). A coroutine writing with ``context.write``, as RingReturn.
        await self._admit(context, "RingReturn")
        answers = Coalescer[StepResult | RingEnded](partial(self._answers, context), MAX_BATCH_ROWS)
        serving: set[asyncio.Task[None]] = set()
        try:
            async for message in request_iterator:
                for opened in subscribed(message):
                    task = asyncio.ensure_future(self._serve_ring(opened, answers))
                    serving.add(task)
                    task.add_done_callback(serving.discard)
            await asyncio.gather(*serving)  # the head stopped subscribing: serve what runs to its end
        except MeshnetError as error:
            await abort_with(context, error)
        except DecodeError as error:
            await abort_with(context, InvalidArgument(f"the message is not a valid RingSubscribe: {error}"))
        finally:
            for task in list(serving):
                task.cancel()

    async def _answers(self, context: grpc.aio.ServicerContext, items: Sequence[StepResult | RingEnded]) -> None:
        await context.write(answers_to_proto(items))
        answers = sum(isinstance(item, StepResult) for item in items)
        if answers:  # a message that only ends rings (a session's end) carries no token
            self.shard.seams.add(answers)

    async def _serve_ring(self, opened: pb.RingOpen, answers: Coalescer[StepResult | RingEnded]) -> None:
        """Serve one subscribed session's ring until it ends here; then say why, for it alone."""
        try:
            session_id, request_id = ring_open_from_proto(opened)
            await self.shard.ring_mailbox(session_id, request_id).serve(answers.send)
            end = RingEnded(session_id, Unavailable.code, "the tail closed the session's ring")
        except MeshnetError as error:
            end = RingEnded(opened.session_id, error.code, error.message)
        with contextlib.suppress(Exception):
            await answers.send(end)

    async def RingBatch(
        self, request_iterator: AsyncIterator[pb.StepBatch], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.BatchAck]:
        # Rows go to their sessions' streams, which check and run them as their own frames; only a
        # row no session here may take is answered, and dropped alone.
        caller = await self._admit(context, "RingBatch")
        sender = None if caller is None else caller.node_id
        failure: MeshnetError | None = None
        try:
            async for batch in request_iterator:
                refused = [r for row in batch_rows(batch) if (r := self._dispatch(row, sender)) is not None]
                if refused:
                    yield refused_to_proto(refused)
        except MeshnetError as error:
            failure = error
        except DecodeError as error:
            failure = InvalidArgument(f"the message is not a valid StepBatch: {error}")
        if failure is not None:
            await abort_with(context, failure)

    def _dispatch(self, row: pb.StepRequest, sender: str | None) -> RefusedRow | None:
        session_id = row_session(row)
        stream = self._streams.get(session_id)
        opener, session_epoch = (None, None) if stream is None else (stream.opener, stream.epoch)
        reason = row_refusal(stream is not None, sender, opener, epoch=row_epoch(row), session_epoch=session_epoch)
        if reason is not None or stream is None:
            # The sender's leg incarnation goes back as it came: only that leg may act on it.
            return RefusedRow(session_id, row_step(row), reason or "no such session", row_incarnation(row))
        stream.offer(row)
        return None

    async def Session(
        self, request_iterator: AsyncIterator[pb.StepRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StepResponse]:
        caller = await self._admit(context, "Session")
        opener = None if caller is None else caller.node_id
        remaining = context.time_remaining()
        stream = SessionStream[pb.StepRequest](
            self.shard, None if remaining is None else time.monotonic() + remaining, opener
        )
        failure: MeshnetError | None = None
        frames = aiter(request_iterator)
        try:
            while (message := await stream.next_frame(frames)) is not None:
                frame = frame_from_proto(message, self.shard.limits)
                if stream.session_id is None:  # the opening frame: whose session, and may it start here
                    self._check_owner(frame.meta.session_id, frame.meta.route_epoch, opener)
                    if caller is not None:
                        enforce(authorize_opening(caller, frame.meta.layers.start))
                opening = stream.session_id is None
                result = await stream.run(frame)
                if opener is not None and opening and stream.epoch is not None:
                    self._openers[frame.meta.session_id] = (opener, stream.epoch)
                if opening:
                    self._streams[frame.meta.session_id] = stream  # its ring rows come here now
                async for answer in stream.answers(frame, result):
                    yield result_to_proto(answer)
        except MeshnetError as error:
            failure = error
        except DecodeError as error:
            # The generated deserializer runs inside the request iterator: an unparsable frame is
            # the sender's malformed input (INVALID_ARGUMENT), not a server fault (UNKNOWN).
            failure = InvalidArgument(f"the frame is not a valid StepRequest: {error}")
        finally:
            if stream.session_id is not None and self._openers.get(stream.session_id) == (opener, stream.epoch):
                del self._openers[stream.session_id]  # unless a newer route took the id over
            if stream.session_id is not None and self._streams.get(stream.session_id) is stream:
                del self._streams[stream.session_id]
            await stream.end(failure)
        if failure is not None:
            log.info("session %s failed: [%s] %s", stream.session_id, failure.code, failure.message)
            await abort_with(context, failure)


async def _joined(pieces: AsyncIterator[pb.SnapshotPiece], limit: int) -> bytes:
    """A peer's snapshot file from its pieces; refused past ``limit`` bytes (the disk budget)."""
    data = bytearray()
    async for piece in pieces:
        data += piece.data
        if len(data) > limit:
            raise ResourceExhausted(f"a snapshot copy past this worker's {limit}-byte snapshot disk")
    return bytes(data)
