"""Join invites across secured tracker replicas sharing one etcd store: a token made with
``meshnet swarm invite --store`` for replica b is redeemed at b, and its single use is spent
for replica a too. Two in-process secured trackers on copies of one swarm dir (as README says
to give every replica), real TLS joins through ``join_swarm`` (what ``--join`` runs)."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest
from etcd_harness import needs_etcd

from meshnet.cli.commands.swarm import create_invite
from meshnet.core.swarm_options import SwarmArguments
from meshnet.deploy.etcd_cluster import etcd_cluster
from meshnet.membership.join import join_swarm
from meshnet.security.invites import InviteRefused, JoinToken
from meshnet.security.swarm_dir import init_swarm
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.server import RunningTracker, start_tracker
from meshnet.tracker.swarm_service import load_tracker_security
from meshnet.wire.tls import LinkSecurity

pytestmark = [needs_etcd, pytest.mark.timeout(90)]


async def replica(store: str, name: str, data_dir: Path) -> RunningTracker:
    config = TrackerConfig(port=0, join_port=0, store=store, replica_id=name, shutdown_grace_s=0.5)
    return await start_tracker(config, security=load_tracker_security(data_dir, time.time()))


def address(tracker: RunningTracker) -> str:
    assert tracker.join_address is not None
    return tracker.join_address


async def test_an_invite_for_one_replica_is_redeemed_there_once_for_all(tmp_path: Path) -> None:
    init_swarm(tmp_path / "a", time.time())
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # b's machine: a copy of the swarm dir
    with etcd_cluster(tmp_path / "etcd", size=1) as cluster:
        a = await replica(cluster.store, "a", tmp_path / "a")
        b = await replica(cluster.store, "b", tmp_path / "b")
        try:
            # Made on a's machine, after b's copy was taken: b's book never saw it.
            arguments = SwarmArguments("invite", role="worker", uses=1, store=cluster.store, join_address=address(b))
            token = create_invite(arguments, tmp_path / "a")
            joined = await asyncio.to_thread(join_swarm, token, tmp_path / "first")
            assert LinkSecurity(joined).identity.role == "worker"
            at_a = JoinToken(token.ca_fingerprint, token.secret, address(a))
            with pytest.raises(InviteRefused, match="already used 1 of 1"):
                await asyncio.to_thread(join_swarm, at_a, tmp_path / "second")
            # The book of a's data dir was not written: the store is where replicas' invites live.
            local = create_invite(SwarmArguments("invite", uses=1, join_address=address(a)), tmp_path / "a")
            with pytest.raises(InviteRefused, match="--store"):
                await asyncio.to_thread(join_swarm, local, tmp_path / "third")
        finally:
            await b.stop(grace_s=0)
            await a.stop(grace_s=0)
