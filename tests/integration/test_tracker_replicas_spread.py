"""Clients given three tracker replicas spread over them (issue 36), all real processes.

Three tracker replicas on a 3-member etcd cluster (``test_tracker_replicas``' fixtures) and nine
nodes, each a real ``TrackerClient`` given all three addresses and keyed by its node id, as a
worker's is. What each replica serves is read from the replica's side: the digest of the nodes it
heard in the last interval, which it writes to etcd (``heard/<replica>``,
``tracker.etcd.membership``). Every replica hears its own nodes and only those; SIGKILL one and
its nodes move to the others while every other node stays with the replica it had.

The node ids are chosen once the replicas' ports are known, three per replica by
``replica_order`` (the ports, hence the ranking, change from run to run): the test checks that
the client follows that ranking and that the replicas see it, not how evenly a hash spreads
(``tests/unit/membership/test_replicas.py`` does).
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest
from etcd_harness import needs_etcd
from test_tracker_replicas import INTERVAL_S, replicas
from worker_harness import fake_record

from meshnet.core.errors import DeadlineExceeded, Unavailable
from meshnet.core.ids import NodeId
from meshnet.core.layers import LayerRange
from meshnet.core.tracking import NodeLoad
from meshnet.deploy.etcd_cluster import EtcdCluster, etcd_cluster
from meshnet.membership.replicas import replica_order
from meshnet.membership.tracker_client import TrackerClient
from meshnet.tracker.etcd.client import EtcdClient, parse_endpoints
from meshnet.tracker.etcd.membership import HEARD_PREFIX
from meshnet.tracker.etcd.membership_values import decode_digest

pytestmark = [needs_etcd, pytest.mark.timeout(90)]

PER_REPLICA = 3
SETTLE_S = 20.0
"""Bound on the wait for the digests to show a state (a digest is rewritten twice per interval
of 1 s, a dead replica's expires within an expiry window of 3 s): generous for a loaded machine."""


def nodes_by_first_choice(addresses: tuple[str, ...]) -> dict[str, list[NodeId]]:
    """``PER_REPLICA`` node ids whose first choice is each replica (by address)."""
    chosen: dict[str, list[NodeId]] = {address: [] for address in addresses}
    index = 0
    while any(len(ids) < PER_REPLICA for ids in chosen.values()):
        node = NodeId(f"spread-{index}")
        first = addresses[replica_order(node, addresses)[0]]
        if len(chosen[first]) < PER_REPLICA:
            chosen[first].append(node)
        index += 1
    return chosen


async def heard(cluster: EtcdCluster) -> dict[str, set[NodeId]]:
    """Replica id → the nodes it heard in its last interval, as the replica wrote it to etcd."""
    kvs = await asyncio.to_thread(EtcdClient(parse_endpoints(cluster.store)).get_prefix, HEARD_PREFIX)
    return {kv.key.removeprefix(HEARD_PREFIX): set(decode_digest(kv.value)) for kv in kvs}


async def settle(cluster: EtcdCluster, expected: dict[str, set[NodeId]], what: str) -> None:
    deadline = time.monotonic() + SETTLE_S
    while (seen := await heard(cluster)) != expected:
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {SETTLE_S} s: {what}; heard {seen}, expected {expected}")
        await asyncio.sleep(0.2)


async def heartbeat_forever(client: TrackerClient, node: NodeId, port: int) -> None:
    """A worker's loop, short: register, then heartbeat every interval (the client fails over)."""
    await client.register(fake_record(LayerRange(0, 6), f"127.0.0.1:{port}", n_layers=6), node)
    while True:
        try:
            status = await client.heartbeat(node, NodeLoad(free_sessions=4), timeout_s=INTERVAL_S)
            if not status.known:
                await client.register(fake_record(LayerRange(0, 6), f"127.0.0.1:{port}", n_layers=6), node)
        except (Unavailable, DeadlineExceeded):
            pass  # the client moved on (or will after its strikes): the next beat asks there
        await asyncio.sleep(INTERVAL_S)


async def test_each_replica_serves_its_own_nodes_and_a_killed_ones_move_alone(tmp_path: Path) -> None:
    with etcd_cluster(tmp_path, size=3) as cluster:
        async with replicas(cluster, tmp_path) as running:
            addresses = tuple(address for _, address in running)
            replica_of = {address: f"r{index}" for index, address in enumerate(addresses)}  # as started
            chosen = nodes_by_first_choice(addresses)
            nodes = [node for ids in chosen.values() for node in ids]
            clients = {node: TrackerClient(",".join(addresses), timeout_s=3.0, replica_key=node) for node in nodes}
            beats = [
                asyncio.create_task(heartbeat_forever(client, node, 9300 + index))
                for index, (node, client) in enumerate(clients.items())
            ]
            try:
                await settle(
                    cluster,
                    {replica_of[address]: set(ids) for address, ids in chosen.items()},
                    "each replica hears the nodes that rank it first",
                )

                killed_process, killed = running[0]
                killed_process.send_signal(signal.SIGKILL)
                await killed_process.wait()
                moved = {node: addresses[replica_order(node, addresses)[1]] for node in chosen[killed]}
                expected = {replica_of[address]: set(ids) for address, ids in chosen.items() if address != killed}
                for node, second in moved.items():
                    expected[replica_of[second]].add(node)
                await settle(cluster, expected, "the killed replica's nodes at their second choice, the rest unmoved")
                assert all(
                    clients[node].address == address
                    for address, ids in chosen.items()
                    if address != killed
                    for node in ids
                )
            finally:
                for task in beats:
                    task.cancel()
                await asyncio.gather(*beats, return_exceptions=True)
                for client in clients.values():
                    await client.close()
