"""How three tracker replicas share a swarm's load: clients in the listed order vs spread.

    flock /tmp/bench.lock python scripts/bench_replica_spread.py --nodes 1500 --route-rate 20 \
        --warmup 20 --measure 30 --out bench/results/tracker_scale/spread38-1500n-20rps.json

For each order (``listed``: every node and the gateway start at the first replica, as before
issue 36's spreading; ``spread``: each ranks the replicas by its id), on a fresh 3-member etcd
cluster and 3 fresh ``meshnet tracker`` replicas (mTLS as shipped, all pinned to the tracker
core), it runs the load generator of ``meshnet bench-tracker-scale`` and reads, per replica,
from the replica's side: the CPU time its process used over the measured span (cores), and
the nodes it heard per interval as it wrote them to etcd (``heard/<replica>``, sampled every
interval and averaged), which at one heartbeat per node per interval is its heartbeats per
interval. One machine: replicas, etcd and generator share its cores, so read the shares, not
the absolute figures.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from meshnet.bench.tracker_scale import LoadPoint, TrackerScaleRun, new_document
from meshnet.bench.tracker_scale_config import TrackerScaleConfig
from meshnet.core.addresses import TrackerOrder
from meshnet.deploy.etcd_cluster import EtcdCluster, etcd_cluster
from meshnet.tracker.etcd.client import EtcdClient, parse_endpoints
from meshnet.tracker.etcd.membership import HEARD_PREFIX
from meshnet.tracker.etcd.membership_values import decode_digest

REPLICAS = 3


def heard_per_replica(cluster: EtcdCluster) -> dict[str, int]:
    """Replica id → nodes it heard in its last interval, as it wrote them to etcd."""
    client = EtcdClient(parse_endpoints(cluster.store))
    try:
        kvs = client.get_prefix(HEARD_PREFIX)
    finally:
        client.close()
    return {kv.key.removeprefix(HEARD_PREFIX): len(decode_digest(kv.value)) for kv in kvs}


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


class Sampler:
    """Each replica's heard count every interval, and its CPU time, over the measured span."""

    def __init__(self, cluster: EtcdCluster, pids: dict[str, int], config: TrackerScaleConfig) -> None:
        self.cluster, self.config = cluster, config
        self.processes = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.samples: list[dict[str, int]] = []
        self.cpu: dict[str, float] = {}

    def run(self) -> None:
        time.sleep(self.config.warmup_s)
        started = {name: cpu_seconds(process) for name, process in self.processes.items()}
        begun = time.monotonic()
        while time.monotonic() - begun < self.config.measure_s:
            time.sleep(self.config.heartbeat_interval_s)
            self.samples.append(heard_per_replica(self.cluster))
        elapsed = time.monotonic() - begun
        self.cpu = {name: (cpu_seconds(p) - started[name]) / elapsed for name, p in self.processes.items()}

    def summary(self) -> dict[str, Any]:
        names = sorted(self.processes)
        heard = {name: sum(s.get(name, 0) for s in self.samples) / max(len(self.samples), 1) for name in names}
        return {
            "heard_nodes_per_interval": {name: round(heard[name], 1) for name in names},
            "heartbeats_per_s": {name: round(heard[name] / self.config.heartbeat_interval_s, 1) for name in names},
            "cpu_cores": {name: round(self.cpu.get(name, 0.0), 3) for name in names},
            "samples": len(self.samples),
        }


def one_order(config: TrackerScaleConfig, order: TrackerOrder, nodes: int, rate: float) -> dict[str, Any]:
    config = replace(config, tracker_order=order)
    run = TrackerScaleRun(config, print)
    with etcd_cluster(run.run_dir / "etcd", size=REPLICAS) as cluster:
        trackers = [run.start_tracker(f"r{index}", store=cluster.store)[0] for index in range(REPLICAS)]
        try:
            addresses = tuple(tracker.ready.first if tracker.ready else "" for tracker in trackers)
            sampler = Sampler(cluster, {f"r{index}": t.pid for index, t in enumerate(trackers)}, config)
            thread = threading.Thread(target=sampler.run, daemon=True)
            point = LoadPoint(nodes, rate, False, config.warmup_s, config.measure_s)
            specs = run.specs(addresses, None, point)
            thread.start()
            result = run.generate(specs, f"spread-{order}-{nodes}n")
            thread.join()
        finally:
            for tracker in trackers:
                tracker.stop()
    per_replica = sampler.summary()
    print(order, json.dumps(per_replica))
    replicas = {f"r{index}": address for index, address in enumerate(addresses)}
    return {"tracker_order": order, "replicas": replicas, **per_replica, "generator": result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--route-rate", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--measure", type=float, default=30.0)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/meshnet-replica-spread"))
    parser.add_argument("--out", type=Path, required=True)
    arguments = parser.parse_args()
    config = TrackerScaleConfig(
        data_dir=arguments.data_dir,
        nodes=(arguments.nodes,),
        route_rates=(arguments.route_rate,),
        warmup_s=arguments.warmup,
        measure_s=arguments.measure,
        tracker_core=0,
        generator_cores=(1,) if len(os.sched_getaffinity(0)) > 1 else (0,),
    )
    document = new_document(config)  # the swarm CA made if missing, the machine described
    document.update(
        mode="replica-spread",
        command="scripts/bench_replica_spread.py",
        orders=[one_order(config, order, arguments.nodes, arguments.route_rate) for order in ("listed", "spread")],
        complete=True,
    )
    arguments.out.parent.mkdir(parents=True, exist_ok=True)
    arguments.out.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
