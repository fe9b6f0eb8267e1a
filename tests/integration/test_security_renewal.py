"""Certificates renew in place: real handshakes before and after the old certificate expired.

An in-process secured tracker whose own certificate lives 4 s (it re-mints itself at half life)
and a worker identity of 4 s renewed over the Renew RPC: once both original certificates have
expired, existing clients and new ones still connect, which they could not if either side kept
presenting its first certificate.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from meshnet.membership.join import renew_once
from meshnet.membership.tracker_client import TrackerClient
from meshnet.security.certificates import certificate_expiry, mint_node
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
            renewed = await renew_once(tracker.address, worker)
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
