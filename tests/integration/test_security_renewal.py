"""Certificates renew in place: real handshakes before and after the old certificate expired.

An in-process secured tracker whose own certificate lives 4 s (it re-mints itself at half life)
and a worker identity of 4 s renewed over the Renew RPC: once both original certificates have
expired, existing clients and new ones still connect, which they could not if either side kept
presenting its first certificate. And after a renewal, every call of the tracker client (each
public method, found by enumeration) presents the new certificate, as the tracker sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import grpc.aio
from worker_harness import fake_record

from meshnet.artifact.directory import Advertisement
from meshnet.core.errors import MeshnetError
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layer_costs import LayerCosts, LayerQuestion
from meshnet.core.layers import LayerRange
from meshnet.core.tracking import NodeLoad, NodeWork, QuarantineOrder, RouteTiming, SessionTokens, WorkRecord
from meshnet.membership.join import renew_once
from meshnet.membership.tracker_client import TrackerClient
from meshnet.security.certificates import NodeCertificate, certificate_expiry, mint_node, new_key_and_csr
from meshnet.security.identity import PeerIdentity
from meshnet.security.invites import SwarmBook
from meshnet.security.swarm_dir import book_path, init_swarm, load_identity
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.server import start_tracker
from meshnet.tracker.swarm_service import TrackerSecurity
from meshnet.wire.tls import LinkSecurity

SHORT_S = 4.0


async def test_tracker_and_worker_certificates_renew_without_a_restart(tmp_path: Path) -> None:
    now = time.time()
    authority = init_swarm(tmp_path, now)
    tracker_node = mint_node(authority, node_id="tracker", role="tracker", now_unix_s=now, lifetime_s=SHORT_S)
    security = TrackerSecurity(LinkSecurity(tracker_node), authority, SwarmBook(book_path(tmp_path)))
    config = TrackerConfig(port=0, join_port=0, db_path=tmp_path / "tracker.sqlite3", heartbeat_interval_s=0.5)
    tracker = await start_tracker(config, security=security)
    worker = LinkSecurity(
        mint_node(authority, node_id="w-renewed", role="worker", now_unix_s=now, lifetime_s=SHORT_S),
        store=tmp_path / "worker-identity",
    )
    try:
        async with TrackerClient(tracker.address, timeout_s=3.0, security=worker) as client:
            assert await client.list_models() == ()
            renewed = await renew_once(client, worker)
            assert certificate_expiry(renewed.cert_pem) > now + 3600
            assert worker.identity.node_id == "w-renewed"  # same node, same role
            assert load_identity(tmp_path / "worker-identity").cert_pem == renewed.cert_pem
            await asyncio.sleep(max(now + SHORT_S + 0.5 - time.time(), 0.0))  # both originals expired
            assert await client.list_models() == ()  # the client moved to a new channel
        async with TrackerClient(tracker.address, timeout_s=3.0, security=worker) as fresh:
            assert await fresh.list_models() == ()  # and the tracker presents its re-minted certificate
        assert security.link.generation >= 1
    finally:
        await tracker.stop()
        security.book.close()


class RecordingLink(LinkSecurity):
    """The tracker's own identity, noting which certificate each caller presented: ``peer`` runs
    once per call on every service of the tracker's port (Tracker, SwarmStatus, Swarm,
    ArtifactDirectory), before any verdict, so a refused call is noted too."""

    def __init__(self, node: NodeCertificate) -> None:
        super().__init__(node)
        self.seen: list[PeerIdentity] = []

    def peer(self, context: grpc.aio.ServicerContext | grpc.ServicerContext) -> PeerIdentity:
        identity = super().peer(context)
        self.seen.append(identity)
        return identity


def public_calls() -> set[str]:
    """Every public coroutine (or async generator) of the tracker client: each is a tracker call."""
    return {
        name
        for name, member in inspect.getmembers(TrackerClient)
        if not name.startswith("_")
        and name != "close"
        and (inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member))
    }


async def _first(updates: AsyncIterator[frozenset[str]]) -> frozenset[str]:
    async for revoked in updates:
        return revoked
    raise AssertionError("the watch ended without a list")


def every_call(client: TrackerClient, me: NodeId) -> dict[str, Callable[[], Awaitable[object]]]:
    """One invocation of each tracker call, as this worker would make it (some are refused to a
    worker: the certificate it presented is noted all the same)."""
    registration = fake_record(LayerRange(0, 4), "127.0.0.1:9001", n_layers=4)
    shares = (NodeWork(me, LayerRange(0, 4), 8),)
    record = WorkRecord(RequestId("req-1"), "tiny", "completed", 3, 5, shares, 0.1, started_at=1.0, finished_at=2.0)
    held = Advertisement(me, "127.0.0.1:9001", frozenset({"ab" * 32}))
    question = LayerQuestion("tiny", LayerCosts((1 << 20,) * 4, 1024), 1 << 30)
    return {
        "register": lambda: client.register(registration, me),
        "heartbeat": lambda: client.heartbeat(me, NodeLoad(free_sessions=4)),
        "deregister": lambda: client.deregister(me),
        "suggest_layers": lambda: client.suggest_layers(question),
        "watch_revocations": lambda: _first(client.watch_revocations()),
        "renew": lambda: client.renew(new_key_and_csr()[1]),
        "revoke": lambda: client.revoke("w-nobody"),
        "choose_route": lambda: client.choose_route("tiny", session_id=SessionId("s-1")),
        "report_work": lambda: client.report_work(record),
        "report_session_tokens": lambda: client.report_session_tokens(me, (SessionTokens(SessionId("s-1"), 1, 8, 3),)),
        "report_route_timing": lambda: client.report_route_timing(RouteTiming((me,), 1.0, tokens=2)),
        "list_models": client.list_models,
        "quarantine": lambda: client.quarantine(QuarantineOrder(NodeId("w-other"), "audit")),
        "list_quarantine": client.list_quarantine,
        "list_nodes": client.list_nodes,
        "advertise": lambda: client.advertise(held),
        "find_holders": lambda: client.find_holders("", ("ab" * 32,)),
    }


async def test_after_a_renewal_every_tracker_call_presents_the_new_certificate(tmp_path: Path) -> None:
    """For each call in turn: a client makes every call (so every channel it keeps is open on
    the current certificate), the certificate is renewed elsewhere in the process, and that call
    is the client's first one after the renewal; the tracker notes the serial of the certificate
    it presented. A method added to the client later is covered too, or this test names it."""
    now = time.time()
    authority = init_swarm(tmp_path, now)
    link = RecordingLink(mint_node(authority, node_id="tracker", role="tracker", now_unix_s=now))
    security = TrackerSecurity(link, authority, SwarmBook(book_path(tmp_path)))
    config = TrackerConfig(port=0, join_port=0, db_path=tmp_path / "tracker.sqlite3", heartbeat_interval_s=0.5)
    tracker = await start_tracker(config, security=security)
    worker = LinkSecurity(mint_node(authority, node_id="w-renewing", role="worker", now_unix_s=now))
    me = NodeId("w-renewing")
    first_after_renewal: dict[str, bool] = {}
    try:
        async with TrackerClient(tracker.address, timeout_s=3.0, security=worker) as renewer:
            for name in sorted(public_calls()):
                async with TrackerClient(tracker.address, timeout_s=3.0, security=worker) as client:
                    calls = every_call(client, me)
                    assert set(calls) == public_calls(), "give every TrackerClient method a call in every_call"
                    old = worker.identity.serial
                    assert all([await _presented(link, call) == {old} for call in calls.values()])
                    await renew_once(renewer, worker)
                    assert worker.identity.serial != old
                    first_after_renewal[name] = await _presented(link, calls[name]) == {worker.identity.serial}
        assert first_after_renewal == dict.fromkeys(public_calls(), True)
    finally:
        await tracker.stop()
        security.book.close()


async def _presented(link: RecordingLink, call: Callable[[], Awaitable[object]]) -> set[int]:
    """The serials of the certificates the tracker saw during ``call``."""
    before = len(link.seen)
    with contextlib.suppress(MeshnetError):  # refused to a worker, no route...: presented all the same
        await call()
    return {identity.serial for identity in link.seen[before:]}
