"""The worker's side of streaming heartbeats against a loopback servicer: a beat keeps its
deadline, and a reply that comes too late is never read as the next beat's (the stream is
dropped and the next beat opens another)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from meshnet.core.errors import DeadlineExceeded
from meshnet.core.ids import NodeId
from meshnet.core.tracking import HeartbeatStatus, NodeLoad
from meshnet.membership.beat_streams import BeatStreams
from meshnet.membership.tracker_client import TrackerClient
from meshnet.wire import services
from meshnet.wire import tracker_wire as wire

NODE = NodeId("node-1")
LATE_S = 1.0


class SlowFirstBeat(services.TrackerServicer):  # type: ignore[misc]
    """Answers each beat with a growing epoch; the very first beat is answered ``LATE_S`` late."""

    def __init__(self) -> None:
        self.beats = 0
        self.streams = 0

    async def Beat(self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        self.streams += 1
        async for _request in requests:
            self.beats += 1
            if self.beats == 1:
                await asyncio.sleep(LATE_S)
            yield wire.heartbeat_status_to_proto(HeartbeatStatus(True, self.beats))


@pytest.fixture
async def slow() -> AsyncIterator[tuple[SlowFirstBeat, str]]:
    servicer = SlowFirstBeat()
    server = grpc.aio.server()
    services.add_tracker_servicer(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield servicer, f"127.0.0.1:{port}"
    await server.stop(None)


async def test_a_late_reply_fails_its_beat_and_is_never_read_as_the_next(slow: tuple[SlowFirstBeat, str]) -> None:
    servicer, address = slow
    async with TrackerClient(address, timeout_s=2.0) as client:
        with pytest.raises(DeadlineExceeded):
            await client.heartbeat(NODE, NodeLoad(), timeout_s=0.2)
        # The first beat's reply (epoch 1) is still on its way on the first stream: the second
        # beat goes on a new stream and gets its own reply.
        assert (await client.heartbeat(NODE, NodeLoad(), timeout_s=2.0)).epoch == 2
        assert (await client.heartbeat(NODE, NodeLoad(), timeout_s=2.0)).epoch == 3
        assert client.heartbeat_transport == "stream"
    assert servicer.streams == 2  # one dropped with the late beat, one carrying the rest


class FakeBeatCall:
    """A ``Beat`` call that the asyncio side still takes for open (``done()`` False): its write
    fails with ``write_error`` (grpc's INTERNAL for a stream the core had already ended), or is
    answered with ``reply``."""

    def __init__(self, reply: Any = None, write_error: grpc.RpcError | None = None) -> None:
        self.reply, self.write_error = reply, write_error
        self.written: list[Any] = []
        self.cancelled = False

    def done(self) -> bool:
        return False

    async def write(self, request: Any) -> None:
        if self.write_error is not None:
            raise self.write_error
        self.written.append(request)

    async def read(self) -> Any:
        return self.reply

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class FakeChannel:
    """Hands out ``calls`` in order as ``Beat`` streams are opened; every other method is unused."""

    def __init__(self, *calls: FakeBeatCall) -> None:
        self.calls = list(calls)
        self.opened: list[FakeBeatCall] = []

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        def open_beat(**options: Any) -> FakeBeatCall:
            self.opened.append(self.calls.pop(0))
            return self.opened[-1]

        return open_beat

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def ended_in_core() -> grpc.aio.AioRpcError:
    """What grpc's asyncio client raises for a write on a stream its core already finished."""
    empty = grpc.aio.Metadata()
    return grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, empty, empty, "Internal error from Core")


def beat(load: int) -> services.NodeHeartbeat:
    return wire.heartbeat_to_proto(NODE, NodeLoad(free_sessions=load))


def answer(epoch: int) -> services.HeartbeatReply:
    return wire.heartbeat_status_to_proto(HeartbeatStatus(True, epoch))


async def test_a_beat_written_on_a_stream_that_already_ended_goes_on_a_fresh_one() -> None:
    """The tracker stopped between two beats and the loop has not yet seen the stream end: the
    beat never left, so it is sent on a new stream (where a dead replica's refusal is what the
    client judges), never reported as the INTERNAL error grpc gives that write."""
    stale = FakeBeatCall(answer(1))
    fresh = FakeBeatCall(answer(2))
    channel = FakeChannel(stale, fresh)
    streams = BeatStreams()
    assert await streams.beat(channel, 0, beat(1), 1.0) == answer(1)
    stale.write_error = ended_in_core()
    assert await streams.beat(channel, 0, beat(2), 1.0) == answer(2)
    assert channel.opened == [stale, fresh] and stale.cancelled
    assert stale.written == [beat(1)] and fresh.written == [beat(2)]


async def test_a_fresh_stream_whose_write_fails_is_the_replicas_answer_and_not_tried_again() -> None:
    channel = FakeChannel(FakeBeatCall(write_error=ended_in_core()), FakeBeatCall(answer(1)))
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await BeatStreams().beat(channel, 0, beat(1), 1.0)
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    assert len(channel.opened) == 1
