"""What the tracker's etcd store costs next to SQLite (issue 36, item 5): record write latency
on a 3-member etcd cluster (and with one member killed) against the SQLite file, and the cost of
one replica's membership digest at 3,000 nodes.

    python scripts/bench_etcd_store.py --out bench/results/tracker_scale/etcd_store.json

All on one machine (loopback, the members' fsyncs on one disk): a cluster on three machines
adds a network round trip per write and spreads the fsyncs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from meshnet.bench.sample_nodes import node_record
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.tracking import NodeLoad, NodeWork, WorkRecord
from meshnet.deploy.etcd_cluster import etcd_cluster
from meshnet.tracker.etcd.client import EtcdClient, parse_endpoints
from meshnet.tracker.etcd.membership import HEARD_PREFIX, SharedMembership
from meshnet.tracker.etcd.membership_values import decode_digest, encode_digest
from meshnet.tracker.etcd.store import EtcdTrackerStore
from meshnet.tracker.registry import NodeRegistry
from meshnet.tracker.store import SqliteTrackerStore, TrackerStore


def record(index: int) -> WorkRecord:
    return WorkRecord(
        request_id=RequestId(f"req-{index:08}"),
        model="tiny",
        status="completed",
        tokens_in=100,
        tokens_out=200 + index % 7,
        attribution=(NodeWork(NodeId("n-a"), LayerRange(0, 15), 300), NodeWork(NodeId("n-b"), LayerRange(15, 30), 300)),
        billing_units=0.3,
        started_at=1_700_000_000.0,
        finished_at=1_700_000_001.0,
        session_id=SessionId(f"s-{index}"),
    )


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "p50_ms": round(1000 * statistics.median(ordered), 3),
        "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
        "mean_ms": round(1000 * statistics.fmean(ordered), 3),
    }


def timed(calls: int, call: Callable[[int], object]) -> list[float]:
    samples = []
    for index in range(calls):
        start = time.perf_counter()
        call(index)
        samples.append(time.perf_counter() - start)
    return samples


def write_latency(store: TrackerStore, calls: int, offset: int = 0) -> dict[str, float]:
    return percentiles(timed(calls, lambda index: store.record_work(record(offset + index), 1.0)))


def load(index: int, peers: int) -> NodeLoad:
    return NodeLoad(
        active_sessions=index % 4,
        free_sessions=4,
        queue_depth=index % 3,
        kv_used_fraction=0.25,
        peer_rtt_ms=tuple((f"10.{index % 250}.{peer}.7:7000", 12.5 + peer) for peer in range(peers)),
        memory_used_bytes=1 << 30,
        memory_budget_bytes=2 << 30,
    )


def digest_cost(client: EtcdClient, nodes: int, peers: int, rounds: int) -> dict[str, object]:
    heard = {NodeId(f"node-{index:05}"): load(index, peers) for index in range(nodes)}
    encode = timed(rounds, lambda _: encode_digest(heard))
    value = encode_digest(heard)
    lease = client.grant_lease(10)
    publish = timed(rounds, lambda _: client.put(HEARD_PREFIX + "bench", value, lease))
    read = timed(rounds, lambda _: [decode_digest(kv.value) for kv in client.get_prefix(HEARD_PREFIX)])
    return {
        "nodes": nodes,
        "peer_entries_per_node": peers,
        "digest_bytes": len(value),
        "encode": percentiles(encode),
        "publish_put": percentiles(publish),
        "read_and_decode": percentiles(read),
    }


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def watch_loop(done: asyncio.Event, stalls: list[float]) -> None:
    """Until ``done``: how much later than asked each 1 ms sleep woke (the loop was held)."""
    while not done.is_set():
        before = time.perf_counter()
        await asyncio.sleep(0.001)
        stalls.append(time.perf_counter() - before - 0.001)


async def exchange_cost(store: str, nodes: int, rounds: int) -> dict[str, object]:
    """Two replicas: ``nodes`` registered and heard at one; the other adopts them, then follows
    their heartbeats. The wall time of each exchange and the longest the follower's event loop
    was held (what a heartbeat arriving meanwhile would wait)."""
    clock = Clock()
    publisher, follower = (
        SharedMembership(
            EtcdClient(parse_endpoints(store)), NodeRegistry(clock=clock, heartbeat_interval_s=2.0), name, 2.0
        )
        for name in ("publisher", "follower")
    )
    ids = [NodeId(f"node-{index:05}") for index in range(nodes)]
    for index, node in enumerate(ids):
        address = f"10.0.{index // 250}.{index % 250}:7000"
        publisher.registry.register(node_record(index % 20, index % 20 + 1, address=address), node)
    figures: list[dict[str, float]] = []
    for _ in range(rounds):
        clock.now += 2.0
        for node in ids:
            publisher.registry.heartbeat(node, load(0, 12))
        started = time.perf_counter()
        await publisher.exchange()
        published = time.perf_counter() - started
        stall: list[float] = []
        done = asyncio.Event()
        watcher = asyncio.create_task(watch_loop(done, stall))
        started = time.perf_counter()
        await follower.exchange()
        followed = time.perf_counter() - started
        done.set()
        await watcher
        figures.append(
            {
                "publisher_exchange_ms": round(1000 * published, 1),
                "follower_exchange_ms": round(1000 * followed, 1),
                "follower_longest_loop_stall_ms": round(1000 * max(stall, default=0.0), 1),
            }
        )
    return {"nodes": nodes, "rounds (the first adopts every node)": figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--writes", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        sqlite = SqliteTrackerStore(root / "tracker.sqlite3")
        results: dict[str, object] = {"sqlite_record_work": write_latency(sqlite, args.writes)}
        sqlite.close()
        with etcd_cluster(root / "three", size=3) as cluster:
            client = EtcdClient(parse_endpoints(cluster.store))
            store = EtcdTrackerStore(client)
            results["etcd3_record_work"] = write_latency(store, args.writes)
            results["etcd3_record_work_duplicate"] = write_latency(store, args.writes // 5)
            results["etcd3_save_epoch"] = percentiles(
                timed(args.writes // 5, lambda index: store.save_epoch(index + 1))
            )
            # A digest carries compact loads (no peer lists: membership_values.compact), so the two are
            # equal; 12 entries is what a node's heartbeat carries to its own replica.
            results["digest_3000_nodes"] = digest_cost(client, 3000, 12, args.rounds)
            results["exchange_3000_nodes"] = asyncio.run(exchange_cost(cluster.store, 3000, 3))
            cluster.members[0].kill()  # the member the client asked first
            results["etcd3_one_member_killed_record_work"] = write_latency(store, args.writes, offset=10 * args.writes)
    results["command"] = "python scripts/bench_etcd_store.py --out " + str(args.out)
    results["machine"] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_1_5_15_min_at_end": os.getloadavg(),
    }
    results["note"] = (
        "one machine, loopback, every etcd member and the SQLite file fsyncing on the same disk; "
        "writes are serial (one caller), so p50 is the per-write latency, not the throughput; the "
        "machine (2 cores) was shared with other jobs, which is where the p99 tails come from"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
