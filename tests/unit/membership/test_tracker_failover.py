"""``TrackerClient`` over several replicas: which replica each call goes to, and when it is repeated.

The replicas are real gRPC servers on loopback that answer heartbeats and report calls (the
client under test is real; these servers stand in for trackers and only count calls, or answer
as told: slowly, with a storage failure, with an error of their own). A "lost" replica is a port
whose server stopped: the client's call fails to connect, as after a SIGKILL.
``tests/integration/test_tracker_replicas.py`` does the same with real tracker processes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest

from meshnet.core.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    MeshnetError,
    StorageUnavailable,
    TrackerBusy,
    Unreachable,
)
from meshnet.core.ids import NodeId, SessionId
from meshnet.core.tracking import HeartbeatStatus, NodeLoad, RouteTiming, SessionTokens
from meshnet.membership.replicas import SLOW_STRIKES, RetryBudget, replica_order
from meshnet.membership.tracker_client import TrackerClient
from meshnet.membership.tracker_failover import RETRY_FLOOR_S
from meshnet.security.certificates import create_authority, mint_node
from meshnet.wire import services, speed_wire, work_wire
from meshnet.wire import tracker_wire as wire
from meshnet.wire.status import abort_with
from meshnet.wire.tls import LinkSecurity

NODE = NodeId("node-1")


@dataclass
class Replica(services.TrackerServicer):  # type: ignore[misc]
    """Answers heartbeats (``known``) and reports, counting each. ``busy_s`` sheds heartbeats,
    ``fail`` answers them with that error, ``delay_s`` answers them that late, ``on_call`` runs
    first; ``time_left`` keeps each heartbeat's remaining deadline as the server saw it."""

    epoch: int
    busy_s: float | None = None
    fail: MeshnetError | None = None
    delay_s: float = 0.0
    on_call: Callable[[], None] | None = None
    calls: list[str] = field(default_factory=list)
    time_left: list[float] = field(default_factory=list)

    async def Heartbeat(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.calls.append("Heartbeat")
        self.time_left.append(context.time_remaining() or 0.0)
        if self.on_call is not None:
            self.on_call()
        await asyncio.sleep(self.delay_s)
        if self.busy_s is not None:
            await abort_with(context, TrackerBusy("shedding heartbeats", self.busy_s))
        if self.fail is not None:
            await abort_with(context, self.fail)
        return wire.heartbeat_status_to_proto(HeartbeatStatus(True, self.epoch))

    async def ReportSessionTokens(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.calls.append("ReportSessionTokens")
        return work_wire.session_tokens_ack_to_proto(1)

    async def ReportRouteTiming(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.calls.append("ReportRouteTiming")
        return speed_wire.timing_ack_to_proto(True)


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
    async with TrackerClient(addresses(replicas), order="listed", timeout_s=2.0) as client:
        assert [await beat(client) for _ in range(3)] == [1, 1, 1]
    assert [len(one.replica.calls) for one in replicas] == [3, 0, 0]


async def test_a_heartbeat_lost_with_its_replica_is_asked_of_the_next_once(replicas: list[Running]) -> None:
    async with TrackerClient(addresses(replicas), order="listed", timeout_s=2.0) as client:
        assert await beat(client) == 1
        await replicas[0].kill()
        assert await beat(client) == 2  # the same call, answered by the next replica
        assert client.address == replicas[1].address
        assert await beat(client) == 2  # and the client stays there
    assert replicas[1].replica.calls == ["Heartbeat", "Heartbeat"] and replicas[2].replica.calls == []


async def test_every_call_in_flight_when_its_replica_dies_is_asked_of_the_next_once(replicas: list[Running]) -> None:
    """The first failure to arrive moves the client on; the others, arriving after it, are resent
    there too rather than failing (a gateway has many calls in flight when a replica dies)."""
    replicas[0].replica.delay_s = 5.0  # both calls are still waiting there when it dies
    async with TrackerClient(addresses(replicas), order="listed", timeout_s=3.0, heartbeat_transport="unary") as client:
        calls = asyncio.gather(beat(client), beat(client))
        while len(replicas[0].replica.calls) < 2:
            await asyncio.sleep(0.01)
        await replicas[0].kill()
        assert await calls == [2, 2]
        assert client.address == replicas[1].address
    assert replicas[1].replica.calls == ["Heartbeat", "Heartbeat"] and replicas[2].replica.calls == []


async def test_the_order_wraps_around_past_every_lost_replica(replicas: list[Running]) -> None:
    async with TrackerClient(addresses(replicas), order="listed", timeout_s=2.0) as client:
        await replicas[0].kill()
        await replicas[1].kill()
        # One retry only: this call fails on 0, then waits in vain for 1 to connect ...
        with pytest.raises((Unreachable, DeadlineExceeded)):
            await beat(client)
        # ... and has moved the client on to 2, which answers the next one.
        assert client.address == replicas[2].address
        assert await beat(client) == 3


async def test_session_token_reports_are_resent_on_the_next_replica(replicas: list[Running]) -> None:
    """Stored per assignment (node id, route epoch): a second delivery writes the same counts."""
    sessions = (SessionTokens(SessionId("s-1"), route_epoch=1, positions=4, prompt_tokens=2),)
    async with TrackerClient(addresses(replicas), order="listed", timeout_s=2.0) as client:
        await replicas[0].kill()
        assert await client.report_session_tokens(NODE, sessions) == 1
    assert replicas[1].replica.calls == ["ReportSessionTokens"]


async def test_a_call_not_safe_to_repeat_moves_on_but_is_not_repeated(replicas: list[Running]) -> None:
    timing = RouteTiming((NODE,), decode_ms_per_token=20.0, tokens=8)
    async with TrackerClient(addresses(replicas), order="listed", timeout_s=2.0) as client:
        await replicas[0].kill()
        with pytest.raises(Unreachable):
            await client.report_route_timing(timing)
        assert replicas[1].replica.calls == []  # not delivered twice ...
        assert await client.report_route_timing(timing)  # ... the next one goes to 1
    assert replicas[1].replica.calls == ["ReportRouteTiming"]


async def test_a_busy_replica_keeps_the_client_and_its_hint(replicas: list[Running]) -> None:
    replicas[0].replica.busy_s = 2.5
    async with TrackerClient(addresses(replicas), order="listed", timeout_s=2.0) as client:
        with pytest.raises(TrackerBusy) as shed:
            await beat(client)
        assert shed.value.retry_after_s == pytest.approx(2.5)
        assert client.address == replicas[0].address  # busy is not lost: no failover storm
    assert replicas[1].replica.calls == []


async def test_a_slow_replica_is_never_asked_twice_and_is_left_only_after_repeated_deadlines(
    replicas: list[Running],
) -> None:
    replicas[0].replica.delay_s = 30.0  # alive, but answers after every deadline
    async with TrackerClient(addresses(replicas), order="listed", timeout_s=2.0) as client:
        for strike in range(1, SLOW_STRIKES + 1):
            with pytest.raises(DeadlineExceeded):
                await client.heartbeat(NODE, NodeLoad(), timeout_s=0.2)
            # Never resent: the next replica saw nothing, and the client stays until the last strike.
            assert replicas[1].replica.calls == []
            assert client.address == replicas[1 if strike == SLOW_STRIKES else 0].address
        assert await beat(client) == 2


async def test_an_answer_between_deadlines_forgives_them(replicas: list[Running]) -> None:
    replica = replicas[0].replica
    async with TrackerClient(addresses(replicas), order="listed", timeout_s=2.0) as client:
        for _ in range(2):
            for _ in range(SLOW_STRIKES - 1):
                replica.delay_s = 30.0
                with pytest.raises(DeadlineExceeded):
                    await client.heartbeat(NODE, NodeLoad(), timeout_s=0.2)
            replica.delay_s = 0.0
            assert await beat(client) == 1
        assert client.address == replicas[0].address


async def test_a_replica_answering_deadline_exceeded_itself_keeps_the_client(replicas: list[Running]) -> None:
    """Its own error (with meshnet's metadata) is an answer, however it is typed."""
    replicas[0].replica.fail = DeadlineExceeded("the tracker's store was too slow")
    async with TrackerClient(addresses(replicas), order="listed", timeout_s=2.0) as client:
        for _ in range(SLOW_STRIKES + 1):
            with pytest.raises(DeadlineExceeded):
                await beat(client)
        assert client.address == replicas[0].address
    assert replicas[1].replica.calls == []


async def test_a_replica_cut_off_from_its_store_is_left_and_the_call_resent(replicas: list[Running]) -> None:
    replicas[0].replica.fail = StorageUnavailable("tracker storage failed: disk I/O error")
    async with TrackerClient(addresses(replicas), order="listed", timeout_s=2.0) as client:
        assert await beat(client) == 2  # nothing was stored at 0: asked of 1 at once
        assert client.address == replicas[1].address


async def test_the_retry_gets_what_is_left_of_the_one_deadline(replicas: list[Running]) -> None:
    first = replicas[0].replica
    first.delay_s, first.fail = 0.5, StorageUnavailable("no store")
    async with TrackerClient(addresses(replicas), order="listed") as client:
        assert (await client.heartbeat(NODE, NodeLoad(), timeout_s=1.0)).epoch == 2
    # At least 0.5 s of the 1 s deadline was spent at 0: the retry was given no more than the rest.
    (left,) = replicas[1].replica.time_left
    assert 0.0 < left <= 0.5


async def test_no_retry_with_less_than_the_floor_left(replicas: list[Running]) -> None:
    now = [100.0]

    def spend_the_deadline() -> None:
        now[0] += 1.0 - RETRY_FLOOR_S / 2

    replicas[0].replica.on_call = spend_the_deadline
    replicas[0].replica.fail = StorageUnavailable("no store")
    async with TrackerClient(addresses(replicas), order="listed", clock=lambda: now[0]) as client:
        with pytest.raises(StorageUnavailable):
            await client.heartbeat(NODE, NodeLoad(), timeout_s=1.0)
        assert client.address == replicas[1].address  # moved, but not asked in the time left
    assert replicas[1].replica.calls == []


async def test_retries_stop_when_the_budget_is_spent(replicas: list[Running]) -> None:
    async with TrackerClient(
        addresses(replicas), order="listed", timeout_s=2.0, budget=RetryBudget(tokens=0.0)
    ) as client:
        await replicas[0].kill()
        with pytest.raises(Unreachable):
            await beat(client)
        assert client.address == replicas[1].address
    assert replicas[1].replica.calls == []


async def test_a_closed_client_refuses_calls_and_opens_no_channel(replicas: list[Running]) -> None:
    client = TrackerClient(addresses(replicas), order="listed", timeout_s=2.0)
    assert await beat(client) == 1
    await client.close()
    with pytest.raises(FailedPrecondition):
        await beat(client)
    assert client._calls._channels == {}
    assert [len(one.replica.calls) for one in replicas] == [1, 0, 0]


async def test_one_tracker_is_as_before(replicas: list[Running]) -> None:
    async with TrackerClient(replicas[0].address, timeout_s=2.0) as client:
        assert await beat(client) == 1
        await replicas[0].kill()
        with pytest.raises(Unreachable):
            await beat(client)
        assert client.address == replicas[0].address


def first_choice_not_listed_first(running: list[Running]) -> NodeId:
    """A node id whose own first replica is not the first listed (so "listed" would fail)."""
    listed = tuple(one.address for one in running)
    return next(NodeId(f"w-{index}") for index in range(100) if replica_order(f"w-{index}", listed)[0] != 0)


async def test_a_keyed_client_asks_its_own_first_replica_then_its_second(replicas: list[Running]) -> None:
    node = first_choice_not_listed_first(replicas)
    order = replica_order(node, tuple(one.address for one in replicas))
    async with TrackerClient(addresses(replicas), timeout_s=2.0, replica_key=node) as client:
        assert client.order == tuple(replicas[index].address for index in order)
        assert await beat(client) == order[0] + 1
        await replicas[order[0]].kill()
        assert await beat(client) == order[1] + 1  # asked again on its second choice
    assert [len(one.replica.calls) for one in replicas] == [
        {order[0]: 1, order[1]: 1}.get(index, 0) for index in range(3)
    ]


async def test_a_client_without_a_key_is_keyed_by_its_certificate(replicas: list[Running]) -> None:
    now = time.time()
    node = first_choice_not_listed_first(replicas)
    security = LinkSecurity(mint_node(create_authority("test", now), node_id=node, role="gateway", now_unix_s=now))
    # Never called (the replicas are plaintext): only its order is read.
    async with TrackerClient(addresses(replicas), security=security) as client:
        assert client.order == tuple(replicas[i].address for i in replica_order(node, client.addresses))
    async with TrackerClient(addresses(replicas), security=security, order="listed") as pinned:
        assert pinned.order == pinned.addresses
