"""WatchRevocations over real mTLS: every member role follows the list, a revoked watcher is cut
off, a stopping tracker ends the watches at once.

An in-process secured tracker; watchers are real ``TrackerClient``s of each swarm role running
``follow_revocations`` (what workers, seeders and expert nodes run), and the revocation goes
through the Revoke RPC as ``meshnet swarm revoke`` sends it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from meshnet.core.errors import Unauthenticated
from meshnet.membership.revocations import follow_revocations
from meshnet.membership.tracker_client import TrackerClient
from meshnet.security.certificates import mint_node
from meshnet.security.identity import Role
from meshnet.security.invites import SwarmBook
from meshnet.security.swarm_dir import book_path, init_swarm, load_authority
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.server import RunningTracker, start_tracker
from meshnet.tracker.swarm_service import TrackerSecurity
from meshnet.wire.tls import LinkSecurity

pytestmark = pytest.mark.timeout(60)
ROLES: tuple[Role, ...] = ("worker", "gateway", "admin")


@pytest.fixture
async def tracker(tmp_path: Path) -> AsyncIterator[RunningTracker]:
    now = time.time()
    authority = init_swarm(tmp_path, now)
    link = LinkSecurity(mint_node(authority, node_id="tracker", role="tracker", now_unix_s=now))
    security = TrackerSecurity(link, authority, SwarmBook(book_path(tmp_path)))
    config = TrackerConfig(port=0, join_port=0, db_path=tmp_path / "tracker.sqlite3", shutdown_grace_s=10.0)
    running = await start_tracker(config, security=security)
    yield running
    await running.stop(grace_s=0)
    security.book.close()


def member(tracker: RunningTracker, node_id: str, role: Role) -> LinkSecurity:
    """An identity of the tracker's swarm (its CA sits beside its database)."""
    authority = load_authority(tracker.config.db_path.parent)
    return LinkSecurity(mint_node(authority, node_id=node_id, role=role, now_unix_s=time.time()))


async def _until(condition: object, timeout_s: float = 5.0) -> float:
    """Seconds until ``condition()`` held (fails after ``timeout_s``)."""
    started = time.monotonic()
    while not condition():  # type: ignore[operator]
        assert time.monotonic() - started < timeout_s, "condition not reached in time"
        await asyncio.sleep(0.005)
    return time.monotonic() - started


async def test_every_role_follows_the_list_and_a_revoked_watcher_is_cut_off(tracker: RunningTracker) -> None:
    members = {role: member(tracker, f"{role[0]}-watcher", role) for role in ROLES}
    clients = {role: TrackerClient(tracker.address, security=security) for role, security in members.items()}
    stop = asyncio.Event()
    watches = [
        asyncio.create_task(follow_revocations(clients[role], members[role].revocations.replace, stop))
        for role in ROLES
    ]
    doomed = TrackerClient(tracker.address, security=member(tracker, "w-doomed", "worker"))
    try:
        doomed_first = await anext(aiter(doomed.watch_revocations()))
        assert doomed_first == frozenset()
        async with TrackerClient(tracker.address, security=member(tracker, "a-operator", "admin")) as admin:
            assert await admin.revoke("w-doomed") == (True, False)
        # Each member refuses the revoked node from its next call on: its list has it.
        took = await _until(lambda: all("w-doomed" in m.revocations.current() for m in members.values()))
        assert took < 1.0  # pushed, not polled: measured ~10 ms on loopback
        # The revoked node's own watch is refused for good.
        with pytest.raises(Unauthenticated, match="revoked"):
            await anext(aiter(doomed.watch_revocations()))
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*watches), timeout=5.0)
        for client in [*clients.values(), doomed]:
            await client.close()


async def test_a_stopping_tracker_ends_the_watches_without_waiting_its_grace(tracker: RunningTracker) -> None:
    client = TrackerClient(tracker.address, security=member(tracker, "w-watcher", "worker"))
    updates = client.watch_revocations()
    try:
        assert await anext(updates) == frozenset()
        started = time.monotonic()
        await tracker.stop(grace_s=10.0)
        assert time.monotonic() - started < 2.0  # the open watch did not hold the 10 s grace
        with pytest.raises(StopAsyncIteration):  # ended cleanly: the watcher opens a new one
            await anext(updates)
    finally:
        await updates.aclose()
        await client.close()
