"""The tracker over real gRPC on loopback: every call, typed errors, health, expiry, rejoining."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from manual_clock import ManualClock
from owned_address import answering_node
from worker_harness import fake_record

from meshnet.core.audit_evidence import AuditedRequest, AuditRun, QuarantineEvidence
from meshnet.core.errors import FailedPrecondition, InvalidArgument, NoRoute, PermissionDenied, Unavailable, Uncertified
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import Certification, NodeRecord
from meshnet.core.tracking import (
    NodeLoad,
    NodeWork,
    QuarantineOrder,
    Registered,
    WorkRecord,
)
from meshnet.membership.backoff import RefusalBackoff
from meshnet.membership.heartbeats import heartbeat_loop
from meshnet.membership.reach import PrivateRetry, Reach
from meshnet.membership.tracker_client import TrackerClient
from meshnet.process.launcher import meshnet_command
from meshnet.security.certificates import mint_node
from meshnet.security.swarm_dir import load_authority
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.server import RunningTracker, start_tracker
from meshnet.tracker.swarm_service import load_tracker_security
from meshnet.wire.generated import tracker_pb2 as pb
from meshnet.wire.generated import tracker_pb2_grpc as pb_grpc
from meshnet.wire.tls import LinkSecurity

pytestmark = pytest.mark.timeout(60)

N_LAYERS = 8


def registration(start: int, stop: int, address: str) -> NodeRecord:
    return fake_record(LayerRange(start, stop), address, n_layers=N_LAYERS)


RECIPE_FINGERPRINT = registration(0, N_LAYERS, "x:1").fingerprint


def record(request_id: str) -> WorkRecord:
    return WorkRecord(
        request_id=RequestId(request_id),
        model="tiny",
        status="completed",
        tokens_in=3,
        tokens_out=5,
        attribution=(NodeWork(NodeId("n-1"), LayerRange(0, 8), 8),),
        billing_units=0.01,
        started_at=1.0,
        finished_at=2.0,
    )


@pytest.fixture
def config(tmp_path: Path) -> TrackerConfig:
    return TrackerConfig(port=0, db_path=tmp_path / "tracker.sqlite3", heartbeat_interval_s=0.2)


@pytest.fixture
async def tracker(config: TrackerConfig) -> AsyncIterator[RunningTracker]:
    running = await start_tracker(config)
    yield running
    await running.stop(grace_s=0)


@pytest.fixture
async def client(tracker: RunningTracker) -> AsyncIterator[TrackerClient]:
    async with TrackerClient(tracker.address, timeout_s=2.0) as tracker_client:
        yield tracker_client


async def test_register_route_report_list_deregister(client: TrackerClient) -> None:
    head = await client.register(registration(0, 4, "127.0.0.1:9001"), NodeId("w-9001"))
    tail = await client.register(registration(4, 8, "127.0.0.1:9002"), NodeId("w-9002"))
    assert head.heartbeat_interval_s == pytest.approx(0.2)
    assert (await client.heartbeat(head.node_id, NodeLoad(free_sessions=4))).known
    route = await client.choose_route("tiny", session_id=SessionId("s-1"))
    assert route.node_ids == (head.node_id, tail.node_id)
    assert route.fingerprint == RECIPE_FINGERPRINT and route.epoch == head.epoch
    again = await client.choose_route(RECIPE_FINGERPRINT, session_id=SessionId("s-1"))
    assert replace(again, ticket=None) == replace(route, ticket=None)
    assert route.ticket is not None and again.ticket is not None and not route.ticket.signed  # an insecure tracker
    (model,) = await client.list_models()
    assert (model.name, model.nodes, model.routable) == ("tiny", 2, True)
    ack = await client.report_work(record("req-1"))
    assert (ack.request_id, ack.duplicate) == ("req-1", False)
    assert (await client.report_work(record("req-1"))).duplicate
    assert await client.deregister(tail.node_id)
    assert not (await client.heartbeat(tail.node_id, NodeLoad())).known


async def test_errors_arrive_typed(client: TrackerClient) -> None:
    await client.register(registration(0, 4, "127.0.0.1:9001"), NodeId("w-9001"))
    with pytest.raises(NoRoute, match="4:8"):
        await client.choose_route("tiny")
    with pytest.raises(NoRoute, match="no live shard serves model 'other'"):
        await client.choose_route("other")
    bad = replace(record("req-2"), tokens_out=6)
    await client.report_work(record("req-2"))
    with pytest.raises(FailedPrecondition):
        await client.report_work(bad)


async def test_malformed_registration_is_invalid_argument(tracker: RunningTracker) -> None:
    async with grpc.aio.insecure_channel(tracker.address) as channel:
        stub = pb_grpc.TrackerStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Register(pb.NodeRegistration(node_id="w-1"), timeout=2)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_node_whose_certification_does_not_hold_is_refused_naming_why(tracker: RunningTracker) -> None:
    honest = registration(0, 4, "127.0.0.1:9001")
    broken = honest.certification
    async with TrackerClient(tracker.address) as client:
        unsplit = replace(
            honest,
            certification=Certification.seal(
                broken.fingerprint, broken.backend_version, broken.checks, broken.whole_sha256, "cd" * 32
            ),
        )
        with pytest.raises(Uncertified, match="does not split bit-identically"):
            await client.register(unsplit, NodeId("w-9001"))
        first = await client.register(honest, NodeId("w-9001"))
        # Another build of the same recipe: its whole-model logits differ from the live node's.
        other_build = replace(
            registration(4, 8, "127.0.0.1:9002"),
            certification=Certification.seal(
                broken.fingerprint, broken.backend_version, broken.checks, "cd" * 32, "cd" * 32
            ),
        )
        with pytest.raises(Uncertified) as refused:
            await client.register(other_build, NodeId("w-9002"))
        assert f"node {first.node_id} at 127.0.0.1:9001" in refused.value.message
        assert broken.whole_sha256 in refused.value.message
        with pytest.raises(NoRoute):
            await client.choose_route("tiny")  # the refused tail never joined


async def test_health_reports_serving(tracker: RunningTracker) -> None:
    async with grpc.aio.insecure_channel(tracker.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "meshnet.v1.Tracker"):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_health_turns_not_serving_as_soon_as_draining_starts(config: TrackerConfig) -> None:
    # G9: watchers learn NOT_SERVING before in-flight calls are refused.
    running = await start_tracker(config)
    async with grpc.aio.insecure_channel(running.address) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service="meshnet.v1.Tracker"))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        stopping = asyncio.create_task(running.stop(grace_s=1.0))
        update = await asyncio.wait_for(watch.read(), timeout=1.0)
        assert update.status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()
        await stopping


async def test_an_unreachable_tracker_is_unavailable_quickly() -> None:
    async with TrackerClient("127.0.0.1:1", timeout_s=2.0) as client:
        started = time.monotonic()
        with pytest.raises(Unavailable) as caught:
            await client.choose_route("tiny")
    assert not isinstance(caught.value, NoRoute)
    assert time.monotonic() - started < 2.0


def stored_epoch(db_path: Path) -> int:
    """The epoch the tracker persisted, read from its file (every RPC would sweep by itself)."""
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        (epoch,) = db.execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone()
    return int(epoch)


async def listening(tracker: RunningTracker, clock: ManualClock, until: float) -> None:
    """Move the manual clock to ``until`` as time passes for a tracker that keeps up: in steps
    shorter than its sweep period, each once its sweeper has run. A jump at once is, to the
    tracker, a stall of its own, which it does not count against the nodes (tracker.liveness)."""
    assert tracker.registry is not None
    hearing, period = tracker.registry.hearing, tracker.config.heartbeat_interval_s / 4
    while clock.now < until:
        # Each step waits for one real sweeper period (12.5 ms asleep); on a loaded machine a
        # period may take far longer than that, so the limit is generous.
        await _eventually(lambda: (hearing.expected_at or 0.0) >= clock.now + period, timeout_s=10.0)
        clock.now = min(until, clock.now + period / 2)


async def test_a_silent_node_leaves_routes_within_three_intervals(config: TrackerConfig) -> None:
    # K4 in-process, on the tracker's own clock: a node silent for just under three heartbeat
    # intervals is still routed; just past them the sweeper alone (no call arrives) expires it
    # and persists the next epoch.
    clock = ManualClock(1000.0)
    tracker = await start_tracker(config, clock=clock)
    try:
        async with TrackerClient(tracker.address, timeout_s=2.0) as client:
            registered = await client.register(registration(0, 8, "127.0.0.1:9001"), NodeId("w-9001"))
            silent_since, interval = clock.now, config.heartbeat_interval_s
            await listening(tracker, clock, silent_since + 3 * interval - 0.001)
            assert [model.nodes for model in await client.list_models()] == [1]
            assert stored_epoch(config.db_path) == registered.epoch
            await listening(tracker, clock, silent_since + 3 * interval + 0.001)
            await _eventually(lambda: stored_epoch(config.db_path) == registered.epoch + 1)
            assert await client.list_models() == ()
            status = await client.heartbeat(registered.node_id, NodeLoad())
            assert not status.known and status.epoch == registered.epoch + 1
    finally:
        await tracker.stop(grace_s=0)


RESTARTS = 5


async def test_heartbeat_loop_rejoins_a_restarted_tracker_with_its_id(
    config: TrackerConfig,
) -> None:
    """Each restart stops the tracker as a beat goes out (its load is read just before it is
    sent): that beat ends UNAVAILABLE, or CANCELLED when the tracker had it already. The loop
    used to die on CANCELLED (a run on a loaded machine, where beats are in flight longer, was
    left unregistered for good); it must rejoin under its id, above the epochs it saw, each time."""
    tracker = await start_tracker(config)
    fixed = replace(config, port=tracker.port)
    joined: list[Registered] = []
    epochs: list[int] = []
    stopping: list[asyncio.Task[None]] = []
    beats_before_stop = [2] * RESTARTS

    def load() -> NodeLoad:
        if beats_before_stop and len(stopping) < len(joined):  # registered with the current one
            beats_before_stop[0] -= 1
            if beats_before_stop[0] == 0:
                beats_before_stop.pop(0)
                stopping.append(asyncio.create_task(tracker.stop(grace_s=0)))
        return NodeLoad(free_sessions=4)

    stop = asyncio.Event()
    async with TrackerClient(tracker.address, timeout_s=1.0) as client:
        loop_task = asyncio.create_task(
            heartbeat_loop(
                client,
                NodeId("w-9001"),
                registration(0, 8, "127.0.0.1:9001"),
                load,
                stop,
                on_registered=joined.append,
                on_epoch=epochs.append,
            )
        )
        try:
            for restart in range(1, RESTARTS + 1):
                await _eventually(lambda restart=restart: len(stopping) == restart or loop_task.done())
                await stopping[-1]
                assert not loop_task.done(), loop_task.exception()
                tracker = await start_tracker(fixed)
                await _eventually(lambda restart=restart: len(joined) == restart + 1 or loop_task.done(), 5.0)
                assert not loop_task.done(), loop_task.exception()
                assert joined[-1].node_id == joined[0].node_id
                assert joined[-1].epoch > joined[-2].epoch and epochs[-1] == joined[-1].epoch
            route = await client.choose_route("tiny")
            assert route.node_ids == (joined[0].node_id,)
            stop.set()
            await asyncio.wait_for(loop_task, timeout=2.0)
            # The loop deregistered on the way out.
            with pytest.raises(NoRoute):
                await client.choose_route("tiny")
        finally:
            stop.set()
            await tracker.stop(grace_s=0)


async def test_a_quarantined_node_keeps_asking_and_rejoins_by_itself_once_cleared(tracker: RunningTracker) -> None:
    # Issue 29: the loop used to return on the refusal, so a cleared node never came back
    # (its process lived on, so nothing restarted it). Now it asks again with a bounded backoff.
    stop, joined = asyncio.Event(), []
    backoff = RefusalBackoff(max_beats=2)  # of the tracker's 0.2 s
    node = NodeId("w-9001")
    async with TrackerClient(tracker.address, timeout_s=1.0) as client:
        loop_task = asyncio.create_task(
            heartbeat_loop(
                client,
                node,
                registration(0, 8, "127.0.0.1:9001"),
                lambda: NodeLoad(4),
                stop,
                on_registered=joined.append,
                backoff=backoff,
            )
        )
        try:
            await _eventually(lambda: len(joined) == 1)
            await client.quarantine(QuarantineOrder(node, "an operator's decision"))  # plaintext: no roles
            with pytest.raises(NoRoute):
                await client.choose_route("tiny")
            await asyncio.sleep(1.0)  # refused several times over: the loop must still be asking
            assert not loop_task.done() and len(joined) == 1
            await client.quarantine(QuarantineOrder(node, "cleared", clear=True))
            await _eventually(lambda: len(joined) == 2, timeout_s=2.0)
            assert (await client.choose_route("tiny")).node_ids == (node,)
        finally:
            stop.set()
            await asyncio.wait_for(loop_task, timeout=3.0)


def test_a_refused_node_backs_off_with_jitter_within_bounds() -> None:
    backoff = RefusalBackoff(max_beats=4)
    assert [backoff.wait_s(n, 2.0, lambda: 1.0) for n in range(1, 6)] == [2.0, 4.0, 8.0, 8.0, 8.0]
    assert backoff.wait_s(2, 2.0, lambda: 0.0) == 2.0  # half of it at least


async def _eventually(condition: object, timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


# -- quarantine: the node leaves routes, its record is marked, it cannot come back under its id
# (not even across a tracker restart) until an operator clears it.


async def test_a_quarantined_node_is_out_of_routes_and_its_record_unverified(
    tracker: RunningTracker, config: TrackerConfig
) -> None:
    async with TrackerClient(tracker.address, timeout_s=2.0) as client:
        rogue = await client.register(registration(0, 4, "127.0.0.1:9001"), NodeId("w-9001"))
        honest = await client.register(registration(0, 4, "127.0.0.1:9003"), NodeId("w-9003"))
        tail = await client.register(registration(4, 8, "127.0.0.1:9002"), NodeId("w-9002"))
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
            await client.register(registration(0, 4, "127.0.0.1:9001"), rogue.node_id)
        again = await client.quarantine(QuarantineOrder(rogue.node_id, "again"))
        assert not again.known and not again.record_marked  # idempotent; nothing left to remove
    await tracker.stop(grace_s=0)

    restarted = await start_tracker(config)  # same database: the quarantine survives
    try:
        async with TrackerClient(restarted.address, timeout_s=2.0) as client:
            with pytest.raises(FailedPrecondition):
                await client.register(registration(0, 4, "127.0.0.1:9001"), rogue.node_id)
            # The operator's command, as its own process (the tracker serves on this event loop).
            command = meshnet_command(config.db_path.parent, "swarm", "quarantine", "clear", rogue.node_id)
            child = await asyncio.create_subprocess_exec(
                *command, "--tracker", restarted.address, "--insecure", stdout=asyncio.subprocess.PIPE
            )
            output, _ = await asyncio.wait_for(child.communicate(), timeout=30)
            assert child.returncode == 0 and b"quarantine cleared" in output
            back = await client.register(registration(0, 4, "127.0.0.1:9001"), rogue.node_id)
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


async def _clear_with_cli(data_dir: Path, tracker: str, node_id: str, *flags: str) -> tuple[int, bytes]:
    return await _quarantine_cli(data_dir, tracker, "clear", node_id, *flags)


async def _quarantine_cli(data_dir: Path, tracker: str, *words: str) -> tuple[int, bytes]:
    command = meshnet_command(data_dir, "swarm", "quarantine", *words, "--tracker", tracker)
    child = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await asyncio.wait_for(child.communicate(), timeout=30)
    return child.returncode or 0, output


def _evidence(liar: str) -> QuarantineEvidence:
    """One audited request whose runs isolate ``liar``: it lied on the original and on a replay."""
    runs = [
        ((liar, "w-t1"), "wrong"),
        (("w-h2", "w-t2"), "right"),
        (("w-h3", "w-t1"), "right"),
        ((liar, "w-t2"), "wrong"),
    ]
    audit = AuditedRequest(RequestId("req-1"), tuple(AuditRun(tuple(map(NodeId, n)), out) for n, out in runs))
    return QuarantineEvidence("one_request", (audit,))


async def test_on_a_secured_tracker_only_gateways_quarantine_and_only_admins_clear(tmp_path: Path) -> None:
    now = time.time()
    security = load_tracker_security(tmp_path, now)
    config = TrackerConfig(port=0, join_port=0, db_path=tmp_path / "tracker.sqlite3", heartbeat_interval_s=0.2)
    tracker = await start_tracker(config, security=security)
    authority = load_authority(tmp_path)
    worker = LinkSecurity(mint_node(authority, node_id="w-rogue", role="worker", now_unix_s=now))
    gateway = LinkSecurity(mint_node(authority, node_id="gw-audit", role="gateway", now_unix_s=now))
    try:
        async with answering_node(worker) as address:  # the tracker dials a registration's address back
            async with TrackerClient(tracker.address, timeout_s=5.0, security=worker) as as_worker:
                with pytest.raises(PermissionDenied, match="w-rogue may not register"):
                    await as_worker.register(registration(0, 4, address), NodeId("w-honest"))
                rogue = await as_worker.register(registration(0, 4, address), NodeId("w-rogue"))
                with pytest.raises(PermissionDenied):
                    await as_worker.quarantine(QuarantineOrder(NodeId("w-other"), "a worker's accusation"))
                with pytest.raises(PermissionDenied):
                    await as_worker.quarantine(QuarantineOrder(rogue.node_id, "lifting my own", clear=True))
            async with TrackerClient(tracker.address, timeout_s=3.0, security=gateway) as as_gateway:
                # An accusation without the audit's evidence is refused (issue 29), and so is evidence
                # that isolates another node or none.
                with pytest.raises(PermissionDenied, match="only with the audit's evidence"):
                    await as_gateway.quarantine(QuarantineOrder(rogue.node_id, "audit: tokens differ"))
                with pytest.raises(InvalidArgument, match="isolates node w-other"):
                    await as_gateway.quarantine(QuarantineOrder(rogue.node_id, "framed", evidence=_evidence("w-other")))
                order = QuarantineOrder(rogue.node_id, "audit: tokens differ", evidence=_evidence(rogue.node_id))
                assert (await as_gateway.quarantine(order)).known
                with pytest.raises(PermissionDenied):
                    await as_gateway.quarantine(QuarantineOrder(rogue.node_id, "a gateway's pardon", clear=True))
            # The operator sees the evidence the order carried (and the gateway's refused orders left none).
            code, listed = await _quarantine_cli(tmp_path, tracker.address, "list")
            assert code == 0, listed
            text = listed.decode()
            assert f"node {rogue.node_id}" in text and "evidence (one_request)" in text and "request req-1" in text
            assert f"replay 3  {rogue.node_id} -> w-t2" in text and text.count("differs") == 2, text
            # A plaintext client cannot even talk to the secured port; the default is the admin identity.
            code, _ = await _clear_with_cli(tmp_path, tracker.address, rogue.node_id, "--insecure")
            assert code != 0
            code, output = await _clear_with_cli(tmp_path, tracker.address, rogue.node_id)
            assert code == 0 and b"quarantine cleared" in output, output
            async with TrackerClient(tracker.address, timeout_s=5.0, security=worker) as as_worker:
                back = await as_worker.register(registration(0, 4, address), rogue.node_id)
                assert back.node_id == rogue.node_id
    finally:
        await tracker.stop(grace_s=0)
        security.book.close()


async def test_a_secured_tracker_registers_an_unanswering_or_declared_private_node_private_and_routes_around_it(
    tmp_path: Path,
) -> None:
    """Issue 33: a node the tracker cannot dial back is not refused any more: it is registered
    ``private`` (listed with the words status uses, never routed, no address taken from
    anyone); a node that answers is ``public``; a node may say it is private itself."""
    now = time.time()
    security = load_tracker_security(tmp_path, now)
    # Slow heartbeats: nobody beats here, and the unanswering dial-back takes its 3 s bound.
    config = TrackerConfig(port=0, join_port=0, db_path=tmp_path / "tracker.sqlite3", heartbeat_interval_s=10.0)
    tracker = await start_tracker(config, security=security)
    authority = load_authority(tmp_path)
    names = ("w-public", "w-nat", "w-says")
    members = {name: LinkSecurity(mint_node(authority, node_id=name, role="worker", now_unix_s=now)) for name in names}
    try:
        async with (
            answering_node(members["w-public"]) as public_address,
            answering_node(members["w-says"]) as says_address,
        ):
            replies: dict[str, Registered] = {}
            for name, address, declared in (
                ("w-public", public_address, "auto"),
                ("w-nat", "127.0.0.1:9", "auto"),  # nothing listens there: behind NAT, say
                ("w-says", says_address, "private"),  # answers, but says nobody else could dial it
            ):
                async with TrackerClient(tracker.address, timeout_s=10.0, security=members[name]) as client:
                    replies[name] = await client.register(
                        registration(0, N_LAYERS, address),
                        NodeId(name),
                        declared=declared,  # type: ignore[arg-type]
                    )
            assert {name: reply.reachability for name, reply in replies.items()} == {
                "w-public": "public",
                "w-nat": "private",
                "w-says": "private",
            }
            gateway = LinkSecurity(mint_node(authority, node_id="gw-1", role="gateway", now_unix_s=now))
            async with TrackerClient(tracker.address, timeout_s=5.0, security=gateway) as client:
                table = await client.list_nodes()
                words = {node.node_id: node.reachability_words for node in table.nodes}
                assert words == {
                    "w-public": "public",
                    "w-nat": "private: behind NAT, no relay attached",
                    "w-says": "private: behind NAT, no relay attached",
                }
                for session in range(5):
                    route = await client.choose_route("tiny", session_id=SessionId(f"s-{session}"))
                    assert route.node_ids == ("w-public",)
    finally:
        await tracker.stop(grace_s=0)
        security.book.close()


async def test_a_node_whose_relay_attachment_moves_registers_the_new_address_at_once(tmp_path: Path) -> None:
    """A node behind NAT (``membership.reach``): registered private at its own address while no
    relay carries it, then at each relay it is attached to, each time within a fraction of the
    (10 s) heartbeat interval, and private again once no relay is left."""
    config = TrackerConfig(port=0, db_path=tmp_path / "tracker.sqlite3", heartbeat_interval_s=10.0)
    tracker = await start_tracker(config)
    reach = Reach("127.0.0.1:9001", "private", ("127.0.0.1:7401", "127.0.0.1:7402"))
    joined: list[Registered] = []
    stop = asyncio.Event()
    try:
        async with TrackerClient(tracker.address, timeout_s=2.0) as client:
            beating = asyncio.create_task(
                heartbeat_loop(
                    client,
                    NodeId("w-home"),
                    registration(0, 8, "127.0.0.1:9001"),
                    lambda: NodeLoad(free_sessions=4),
                    stop,
                    on_registered=joined.append,
                    reach=reach,
                )
            )

            async def registered_at() -> tuple[str, str]:
                (node,) = (await client.list_nodes()).nodes
                return node.record.address, node.reachability

            await _eventually(lambda: len(joined) == 1)
            assert await registered_at() == ("127.0.0.1:9001", "private") and reach.wants_relay
            with pytest.raises(NoRoute):
                await client.choose_route("tiny")
            for relayed, count in (("w-home@127.0.0.1:7401", 2), ("w-home@127.0.0.1:7402", 3)):
                moved = time.monotonic()
                reach.moved(relayed)
                await _eventually(lambda count=count: len(joined) == count, timeout_s=2.0)
                took = time.monotonic() - moved
                assert await registered_at() == (relayed, "relayed") and took < 1.0, took
                route = await client.choose_route("tiny")
                assert [hop.address for hop in route.hops] == [relayed]
            reach.moved(None)
            await _eventually(lambda: len(joined) == 4, timeout_s=2.0)
            assert await registered_at() == ("127.0.0.1:9001", "private")
            stop.set()
            await asyncio.wait_for(beating, timeout=2.0)
    finally:
        stop.set()
        await tracker.stop(grace_s=0)


async def test_a_worker_whose_dial_back_failed_registers_again_until_it_is_public(tmp_path: Path) -> None:
    """Review item 3: a default worker (``auto``, no relay) whose first dial-back fails (here its
    server is not up yet; a loaded tracker's timeout alike) is registered private, but it is not
    private for good: it registers again with backoff and is public and routed once it answers."""
    now = time.time()
    security = load_tracker_security(tmp_path, now)
    config = TrackerConfig(port=0, join_port=0, db_path=tmp_path / "tracker.sqlite3", heartbeat_interval_s=10.0)
    tracker = await start_tracker(config, security=security)
    authority = load_authority(tmp_path)
    member = LinkSecurity(mint_node(authority, node_id="w-late", role="worker", now_unix_s=now))
    gateway = LinkSecurity(mint_node(authority, node_id="gw-1", role="gateway", now_unix_s=now))
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"127.0.0.1:{port}"
    reach = Reach(address, "auto", (), PrivateRetry(first_s=0.2, max_s=0.5))
    joined: list[Registered] = []
    stop = asyncio.Event()
    try:
        async with TrackerClient(tracker.address, timeout_s=10.0, security=member) as client:
            load = lambda: NodeLoad(free_sessions=4)  # noqa: E731
            beating = asyncio.create_task(
                heartbeat_loop(
                    client,
                    NodeId("w-late"),
                    registration(0, N_LAYERS, address),
                    load,
                    stop,
                    on_registered=joined.append,
                    reach=reach,
                )
            )
            await _eventually(lambda: len(joined) == 1, timeout_s=6.0)
            assert joined[0].reachability == "private" and reach.declaring == "auto"
            async with answering_node(member, port=port):
                await _eventually(lambda: joined[-1].reachability == "public", timeout_s=8.0)
                async with TrackerClient(tracker.address, timeout_s=5.0, security=gateway) as asking:
                    route = await asking.choose_route("tiny")
                assert [hop.address for hop in route.hops] == [address]
                stop.set()
                await asyncio.wait_for(beating, timeout=2.0)
    finally:
        stop.set()
        reach.close()
        await tracker.stop(grace_s=0)
        security.book.close()
