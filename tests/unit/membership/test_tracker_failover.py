"""``TrackerClient`` over several replicas: which replica each call goes to, and when it is repeated.

The replicas are real gRPC servers on loopback that answer heartbeats and session-token reports
(the client under test is real; these servers stand in for trackers and only count calls). A
"lost" replica is a port whose server stopped: the client's call fails to connect, as after a
SIGKILL. ``tests/integration/test_tracker_replicas.py`` does the same with real tracker processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest

from meshnet.core.errors import TrackerBusy, Unreachable
from meshnet.core.ids import NodeId, SessionId
from meshnet.core.tracking import HeartbeatStatus, NodeLoad, SessionTokens
from meshnet.membership.tracker_client import TrackerClient
from meshnet.wire import services, work_wire
from meshnet.wire import tracker_wire as wire
from meshnet.wire.status import abort_with

NODE = NodeId("node-1")


@dataclass
class Replica(services.TrackerServicer):  # type: ignore[misc]
    """Answers heartbeats (``known``) and token reports, counting each; ``busy_s`` sheds them."""

    epoch: int
    busy_s: float | None = None
    calls: list[str] = field(default_factory=list)

    async def Heartbeat(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.calls.append("Heartbeat")
        if self.busy_s is not None:
            await abort_with(context, TrackerBusy("shedding heartbeats", self.busy_s))
        return wire.heartbeat_status_to_proto(HeartbeatStatus(True, self.epoch))

    async def ReportSessionTokens(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.calls.append("ReportSessionTokens")
        return work_wire.session_tokens_ack_to_proto(1)


@dataclass
class Running:
    replica: Replica
    server: grpc.aio.Server
    address: str

    async def kill(self) -> None:
        await self.server.stop(None)


async def serve(replica: Replica) -> Running:
    server = grpc.aio.server()
    services.add_tracker_servicer(replica, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return Running(replica, server, f"127.0.0.1:{port}")


@pytest.fixture
async def replicas() -> AsyncIterator[list[Running]]:
    running = [await serve(Replica(epoch=index + 1)) for index in range(3)]
    yield running
    for one in running:
        await one.server.stop(None)


def addresses(running: list[Running]) -> str:
    return ",".join(one.address for one in running)


async def beat(client: TrackerClient) -> int:
    return (await client.heartbeat(NODE, NodeLoad(), timeout_s=2.0)).epoch


async def test_calls_stick_to_the_first_replica_that_answers(replicas: list[Running]) -> None:
    async with TrackerClient(addresses(replicas), timeout_s=2.0) as client:
        assert [await beat(client) for _ in range(3)] == [1, 1, 1]
    assert [len(one.replica.calls) for one in replicas] == [3, 0, 0]


async def test_a_heartbeat_lost_with_its_replica_is_asked_of_the_next_once(replicas: list[Running]) -> None:
    async with TrackerClient(addresses(replicas), timeout_s=2.0) as client:
        assert await beat(client) == 1
        await replicas[0].kill()
        assert await beat(client) == 2  # the same call, answered by the next replica
        assert client.address == replicas[1].address
        assert await beat(client) == 2  # and the client stays there
    assert replicas[1].replica.calls == ["Heartbeat", "Heartbeat"] and replicas[2].replica.calls == []


async def test_the_order_wraps_around_past_every_lost_replica(replicas: list[Running]) -> None:
    async with TrackerClient(addresses(replicas), timeout_s=2.0) as client:
        await replicas[0].kill()
        await replicas[1].kill()
        # One retry only: this call fails on 0, then on 1 ...
        with pytest.raises(Unreachable):
            await beat(client)
        # ... and has moved the client on to 2, which answers the next one.
        assert client.address == replicas[2].address
        assert await beat(client) == 3


async def test_a_call_not_safe_to_repeat_moves_on_but_is_not_repeated(replicas: list[Running]) -> None:
    sessions = (SessionTokens(SessionId("s-1"), route_epoch=1, positions=4, prompt_tokens=2),)
    async with TrackerClient(addresses(replicas), timeout_s=2.0) as client:
        await replicas[0].kill()
        with pytest.raises(Unreachable):
            await client.report_session_tokens(NODE, sessions)
        assert replicas[1].replica.calls == []  # not delivered twice ...
        assert await client.report_session_tokens(NODE, sessions) == 1  # ... the next one goes to 1
    assert replicas[1].replica.calls == ["ReportSessionTokens"]


async def test_a_busy_replica_keeps_the_client_and_its_hint(replicas: list[Running]) -> None:
    replicas[0].replica.busy_s = 2.5
    async with TrackerClient(addresses(replicas), timeout_s=2.0) as client:
        with pytest.raises(TrackerBusy) as shed:
            await beat(client)
        assert shed.value.retry_after_s == pytest.approx(2.5)
        assert client.address == replicas[0].address  # busy is not lost: no failover storm
    assert replicas[1].replica.calls == []


async def test_one_tracker_is_as_before(replicas: list[Running]) -> None:
    async with TrackerClient(replicas[0].address, timeout_s=2.0) as client:
        assert await beat(client) == 1
        await replicas[0].kill()
        with pytest.raises(Unreachable):
            await beat(client)
        assert client.address == replicas[0].address
