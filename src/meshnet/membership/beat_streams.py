"""Heartbeats on long-lived streams: one ``Tracker.Beat`` stream per tracker replica, one reply per beat.

A unary heartbeat over mTLS costs the tracker about twice what the same beat costs on an open
stream (measured by ``membership.heartbeat_transport``: 626 vs 306 us), and at thousands of
nodes that is most of a core. A stream answers beats in order, so it carries one beat at a time,
and a beat that fails in any way (an error, the deadline, the tracker ending the stream) drops
the stream: a reply still on its way would otherwise be read as the next beat's. The next beat
opens a new one, on whatever replica the client asks then (``membership.replicas``).

Only the transport lives here: the caller (``TrackerClient.heartbeat``, the load generator's
simulated nodes) judges the errors and decides to fall back to unary heartbeats.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
import grpc.aio

from meshnet.wire import services

__all__ = ["BeatStreamEnded", "BeatStreams"]


class BeatStreamEnded(Exception):
    """The tracker closed the stream without an error (it had no reply for the beat)."""


@dataclass
class _Stream:
    channel: grpc.aio.Channel
    call: grpc.aio.StreamStreamCall


StreamKey = tuple[int, str]
"""A replica (its index in the client's list) and the node beating there: a stream speaks for
the one node its first beat names (a plaintext client may beat for several)."""


class BeatStreams:
    """The open ``Beat`` stream of each replica and node."""

    def __init__(self) -> None:
        self._open: dict[StreamKey, _Stream] = {}
        # One beat at a time on a stream: its replies are matched to beats by order.
        self._locks: dict[StreamKey, asyncio.Lock] = {}
        self.answered = False
        """Whether any stream has carried a reply: then the tracker serves ``Beat``."""

    async def beat(
        self,
        channel: grpc.aio.Channel,
        index: int,
        request: services.NodeHeartbeat,
        timeout_s: float,
        *,
        wait_for_ready: bool = False,
    ) -> services.HeartbeatReply:
        """Send ``request`` on the stream of replica ``index`` and the request's node (opened on
        ``channel`` if none is open there) and read its reply within ``timeout_s``. Raises
        ``grpc.RpcError`` as the stream ended, ``TimeoutError`` past ``timeout_s``,
        ``BeatStreamEnded`` on a plain end."""
        key = (index, request.node_id)
        async with self._locks.setdefault(key, asyncio.Lock()):
            try:
                reply = await asyncio.wait_for(self._exchange(channel, key, request, wait_for_ready), timeout_s)
            except BaseException:
                self._drop(key)
                raise
            self.answered = True
            return reply

    async def _exchange(
        self, channel: grpc.aio.Channel, key: StreamKey, request: services.NodeHeartbeat, wait_for_ready: bool
    ) -> services.HeartbeatReply:
        before = self._open.get(key)
        stream = self._stream(channel, key, wait_for_ready)
        try:
            await stream.call.write(request)
        except (grpc.RpcError, asyncio.InvalidStateError):
            if stream is not before:
                raise  # a fresh stream's failure is the replica's answer
            # The stream had ended before this beat left, and the loop had not yet seen its end
            # (the tracker stopped or restarted between two beats; likelier the later a loaded
            # loop reads completions). grpc reports such a write as INTERNAL, losing the
            # tracker's status (grpc/grpc#36066), which would read as an answer: no failover.
            # The beat never reached the tracker, so it goes once on a fresh stream, whose
            # failure (refused: the replica is gone) says what the replica is.
            self._drop(key)
            stream = self._stream(channel, key, wait_for_ready)
            await stream.call.write(request)
        return await _reply(stream.call)

    def _stream(self, channel: grpc.aio.Channel, key: StreamKey, wait_for_ready: bool) -> _Stream:
        stream = self._open.get(key)
        # A stream that ended while idle (the tracker restarted), or one on a channel since
        # retired (a renewed certificate), is replaced: the beat goes on a fresh one.
        if stream is None or stream.call.done() or stream.channel is not channel:
            self._drop(key)
            call = services.TrackerStub(channel).Beat(wait_for_ready=wait_for_ready)
            stream = self._open[key] = _Stream(channel, call)
        return stream

    def _drop(self, key: StreamKey) -> None:
        stream = self._open.pop(key, None)
        if stream is not None:
            stream.call.cancel()

    def close(self) -> None:
        """Cancel every open stream."""
        for key in list(self._open):
            self._drop(key)


async def _reply(call: grpc.aio.StreamStreamCall) -> services.HeartbeatReply:
    reply = await call.read()
    if reply is grpc.aio.EOF:
        raise BeatStreamEnded("the tracker ended the heartbeat stream")
    return reply
