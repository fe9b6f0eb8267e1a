"""The gRPC Shard servicer: wire adaptation only; decisions live in ``Shard``.

A session lives exactly as long as its stream: when the upstream closes, cancels, or a frame
fails, the session's KV is freed here and the downstream stream is closed, which frees it on
every later shard in turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from meshnet.core.errors import InvalidArgument, MeshnetError, PermissionDenied
from meshnet.core.ids import SessionId
from meshnet.node.ring import watch_error
from meshnet.node.shard import AnyShard
from meshnet.security.identity import PeerIdentity
from meshnet.security.policy import authorize_opening, authorize_shard
from meshnet.wire import services as pb
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
        self._openers: dict[SessionId, str] = {}
        """Who opened each live session (its stream's peer): the only party that may end it."""

    async def _admit(
        self, context: grpc.aio.ServicerContext, rpc: str, session_id: SessionId | None = None
    ) -> PeerIdentity | None:
        """The caller if ``rpc`` is allowed to it; aborts the call otherwise (None: nobody is checked)."""
        if self._security is None:
            return None
        try:
            peer = self._security.peer(context)
            opener = self._openers.get(session_id) if session_id is not None else None
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

    async def _next_frame(
        self, frames: AsyncIterator[pb.StepRequest], session_id: SessionId | None
    ) -> pb.StepRequest | None:
        """The next upstream frame (None at the end of the stream); on a ring, a middle raises here
        as soon as its downstream fails, so the failure reaches the head without waiting for a frame."""
        watch = None if session_id is None else self.shard.ring_watch(session_id)
        if watch is None:
            return await anext(frames, None)
        following = asyncio.ensure_future(anext(frames, None))
        await asyncio.wait({following, watch}, return_when=asyncio.FIRST_COMPLETED)
        if following.done():
            return following.result()
        following.cancel()
        raise watch_error(watch)

    async def RingReturn(self, request: pb.RingOpen, context: grpc.aio.ServicerContext) -> None:
        # Only a swarm worker (the route's head) reads a ring; the request id it must name is
        # known only to the route's own shards. A coroutine writing with ``context.write`` (not
        # a generator) so the tail's steps can write their answers themselves (``RingMailbox``).
        await self._admit(context, "RingReturn")
        try:
            session_id, request_id = ring_open_from_proto(request)
            mailbox = self.shard.ring_mailbox(session_id, request_id)
            await mailbox.serve(lambda result: context.write(result_to_proto(result)))
        except MeshnetError as error:
            await abort_with(context, error)

    async def Session(
        self, request_iterator: AsyncIterator[pb.StepRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StepResponse]:
        caller = await self._admit(context, "Session")
        opener = None if caller is None else caller.node_id
        remaining = context.time_remaining()
        stream_deadline = None if remaining is None else time.monotonic() + remaining
        session_id: SessionId | None = None
        """Set once a frame of this stream succeeded: only then does the session belong to it."""
        failure: MeshnetError | None = None
        frames = aiter(request_iterator)
        try:
            while (message := await self._next_frame(frames, session_id)) is not None:
                frame = frame_from_proto(message, self.shard.limits)
                if session_id is not None and frame.meta.session_id != session_id:
                    raise InvalidArgument("one stream carries one session; open a new stream for another")
                if session_id is None:  # the opening frame: whose session, and may it start here
                    if self._openers.get(frame.meta.session_id, opener) != opener:
                        raise PermissionDenied("this session belongs to another party")
                    if caller is not None:
                        enforce(authorize_opening(caller, frame.meta.layers.start))
                result = await self.shard.handle(frame, stream_deadline)
                session_id = frame.meta.session_id
                if opener is not None:
                    self._openers[session_id] = opener
                if self.shard.answer_upstream(frame):
                    yield result_to_proto(result)
                if frame.continuation is None:
                    continue  # nothing for the head to run by itself (every frame but the last)
                async for continued in self.shard.continue_decoding(frame, result, stream_deadline):
                    yield result_to_proto(continued)
        except MeshnetError as error:
            failure = error
        except DecodeError as error:
            # The generated deserializer runs inside the request iterator: an unparsable frame is
            # the sender's malformed input (INVALID_ARGUMENT), not a server fault (UNKNOWN).
            failure = InvalidArgument(f"the frame is not a valid StepRequest: {error}")
        finally:
            if session_id is not None:
                self._openers.pop(session_id, None)
                if failure is not None:
                    self.shard.fail_ring(session_id, failure)
                reason = "stream ended" if failure is None else f"stream failed: {failure.code}"
                try:
                    await self.shard.end(session_id, reason)
                except MeshnetError:
                    log.exception("releasing session %s failed", session_id)
        if failure is not None:
            log.info("session %s failed: [%s] %s", session_id, failure.code, failure.message)
            await abort_with(context, failure)
