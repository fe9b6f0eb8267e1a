"""Quarantine over real gRPC on loopback: the node leaves routes, its record is marked, it cannot
come back under its id (not even across a tracker restart) until an operator clears it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from test_tracker_service import record, registration

from meshnet.client.tracker_client import TrackerClient
from meshnet.core.errors import FailedPrecondition, InvalidArgument
from meshnet.core.ids import NodeId, RequestId
from meshnet.core.tracking import QuarantineOrder
from meshnet.process.launcher import meshnet_command
from meshnet.protocol.generated import tracker_pb2 as pb
from meshnet.protocol.generated import tracker_pb2_grpc as pb_grpc
from meshnet.tracker.server import RunningTracker, TrackerConfig, start_tracker

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def config(tmp_path: Path) -> TrackerConfig:
    return TrackerConfig(port=0, db_path=tmp_path / "tracker.sqlite3", heartbeat_interval_s=0.5)


@pytest.fixture
async def tracker(config: TrackerConfig) -> AsyncIterator[RunningTracker]:
    running = await start_tracker(config)
    yield running
    await running.stop(grace_s=0)


async def test_a_quarantined_node_is_out_of_routes_and_its_record_unverified(
    tracker: RunningTracker, config: TrackerConfig
) -> None:
    async with TrackerClient(tracker.address, timeout_s=2.0) as client:
        rogue = await client.register(registration(0, 4, "127.0.0.1:9001"))
        honest = await client.register(registration(0, 4, "127.0.0.1:9003"))
        tail = await client.register(registration(4, 8, "127.0.0.1:9002"))
        await client.report_work(record("req-1"))
        answer = await client.quarantine(QuarantineOrder(rogue.node_id, "audit: tokens differ", RequestId("req-1")))
        assert answer.known and answer.record_marked and answer.epoch > rogue.epoch
        for _ in range(5):
            route = await client.choose_route("tiny")
            assert route.node_ids == (honest.node_id, tail.node_id)
        (model,) = await client.list_models()
        assert model.nodes == 2
        # A retried report of the original record is still the duplicate it is.
        assert (await client.report_work(record("req-1"))).duplicate
        with pytest.raises(FailedPrecondition, match="quarantined"):
            await client.register(registration(0, 4, "127.0.0.1:9001"), node_id_hint=rogue.node_id)
        again = await client.quarantine(QuarantineOrder(rogue.node_id, "again"))
        assert not again.known and not again.record_marked  # idempotent; nothing left to remove
    await tracker.stop(grace_s=0)

    restarted = await start_tracker(config)  # same database: the quarantine survives
    try:
        async with TrackerClient(restarted.address, timeout_s=2.0) as client:
            with pytest.raises(FailedPrecondition):
                await client.register(registration(0, 4, "127.0.0.1:9001"), node_id_hint=rogue.node_id)
            # The operator's command, as its own process (the tracker serves on this event loop).
            command = meshnet_command(config.db_path.parent, "swarm", "quarantine", "clear", rogue.node_id)
            child = await asyncio.create_subprocess_exec(
                *command, "--tracker", restarted.address, stdout=asyncio.subprocess.PIPE
            )
            output, _ = await asyncio.wait_for(child.communicate(), timeout=30)
            assert child.returncode == 0 and b"quarantine cleared" in output
            back = await client.register(registration(0, 4, "127.0.0.1:9001"), node_id_hint=rogue.node_id)
            assert back.node_id == rogue.node_id
    finally:
        await restarted.stop(grace_s=0)


async def test_malformed_quarantine_orders_are_invalid_argument(tracker: RunningTracker) -> None:
    async with grpc.aio.insecure_channel(tracker.address) as channel:
        stub = pb_grpc.TrackerStub(channel)
        for bad in (pb.QuarantineRequest(), pb.QuarantineRequest(node_id="n-1", reason="x" * 300)):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Quarantine(bad)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(InvalidArgument):
        QuarantineOrder(NodeId(""), "empty id")
