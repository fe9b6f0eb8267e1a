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
