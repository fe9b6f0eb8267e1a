"""``bench-tracker-scale --mode replica-kill``: three tracker replicas on a three-member etcd
cluster under simulated nodes and gateway load; one replica, then the etcd leader, SIGKILLed.

Every process is real: three ``etcd`` members (``deploy.etcd_cluster``), three ``meshnet
tracker`` replicas on them (mTLS as shipped, pinned to the tracker core) and one load generator
(``membership.load_generator``) whose nodes are spread over the replicas and fail over, and
whose gateway retries a call once on the next replica when its replica is gone, as the gateway
does. The generator does the kills at set moments of its measured span
(``membership.disruptions``); afterwards every work record a replica acknowledged is looked up
in the store (none may be lost). The verdict is the issue's: no gateway call failed beyond its
one retry, no acknowledged record lost, no live node expired.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from meshnet.bench.tracker_scale import LoadPoint, Say, TrackerScaleRun, new_document, write_result
from meshnet.bench.tracker_scale_config import TrackerScaleConfig
from meshnet.core.errors import MeshnetError
from meshnet.deploy.etcd_cluster import EtcdCluster, etcd_cluster, leader_index
from meshnet.membership.disruptions import Kill
from meshnet.process.launcher import ChildProcess
from meshnet.process.tether import CRASH_SIGNAL
from meshnet.tracker.etcd.client import EtcdClient, parse_endpoints
from meshnet.tracker.etcd.store import EtcdTrackerStore

REPLICAS = 3


def records_found(cluster: EtcdCluster, acknowledged_path: Path) -> dict[str, Any]:
    """Every acknowledged record looked up in the store (through the members still alive)."""
    acknowledged: list[str] = json.loads(acknowledged_path.read_text())
    store = EtcdTrackerStore(EtcdClient(parse_endpoints(cluster.store)))
    try:
        stored = {str(record.request_id) for record in store.list_work()}
    finally:
        store.close()
    lost = [request for request in acknowledged if request not in stored]
    return {
        "acknowledged": len(acknowledged),
        "found": len(acknowledged) - len(lost),
        "lost": len(lost),
        "lost_examples": lost[:10],
        "stored_in_all": len(stored),
    }


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    """The acceptance item's three counts, and whether all are zero."""
    failed = sum(result["gateway_calls_failed"].values())
    lost = result["records"]["lost"]
    expired = result["live_nodes_wrongly_expired"] + result["warmup"]["live_nodes_wrongly_expired"]
    return {
        "calls_failed_beyond_one_retry": failed,
        "acknowledged_records_lost": lost,
        "live_nodes_wrongly_expired": expired,
        "held": failed == 0 and lost == 0 and expired == 0 and result["valid"],
    }


def _kills(config: TrackerScaleConfig, trackers: list[ChildProcess], cluster: EtcdCluster) -> tuple[Kill, ...]:
    leader = cluster.members[leader_index(cluster)]
    if leader.child is None:
        raise MeshnetError(f"etcd member {leader.name} has no process")
    return (
        Kill(config.kill_tracker_at_s, trackers[0].pid, "tracker replica r0"),
        # Its tether SIGKILLs etcd and reaps it (a SIGKILL to the tether would orphan etcd).
        Kill(config.kill_store_at_s, leader.child.pid, f"etcd member {leader.name} (the leader)", CRASH_SIGNAL),
    )


def _under_load(run: TrackerScaleRun, cluster: EtcdCluster, name: str) -> dict[str, Any]:
    config = run.config
    trackers: list[ChildProcess] = []
    try:
        for index in range(REPLICAS):
            trackers.append(run.start_tracker(f"r{index}", store=cluster.store)[0])
        addresses = tuple(tracker.ready.first if tracker.ready else "" for tracker in trackers)
        point = LoadPoint(max(config.nodes), max(config.route_rates), False, config.warmup_s, config.measure_s)
        acknowledged = run.run_dir / f"{name}.acknowledged.json"
        # The CPU meter watches a replica that lives: r1.
        spec = replace(
            run.specs(addresses, trackers[1].pid, point)[0],
            kills=_kills(config, trackers, cluster),
            acknowledged_path=acknowledged,
        )
        result = run.generate([spec], name)
        if "error" not in result:
            result["records"] = records_found(cluster, acknowledged)
            result["verdict"] = verdict(result)
        return result
    finally:
        for tracker in trackers:
            tracker.stop()


def measure_replica_kill(config: TrackerScaleConfig, out: Path, say: Say = print) -> dict[str, Any]:
    """The run, written to ``out`` (one point, as the other modes' files)."""
    config = replace(config, generator_processes=1)  # one process sees every node's recovery
    document = new_document(config)
    run = TrackerScaleRun(config, say)
    name = f"replica-kill-{max(config.nodes)}n-{max(config.route_rates):g}rps"
    say(f"{name}: 3 etcd members, 3 replicas; {config.warmup_s:g} s warm-up, {config.measure_s:g} s measured")
    load_before = os.getloadavg()
    try:
        with etcd_cluster(run.run_dir / "etcd", size=3) as cluster:
            result = _under_load(run, cluster, name)
    except (MeshnetError, OSError) as error:
        result = {"error": f"{type(error).__name__}: {error}"}
    result.update(name=name, load_average_before=load_before, load_average_after=os.getloadavg())
    say(f"  {name}: {json.dumps(result.get('verdict') or result.get('error'))}")
    document["points"].append(result)
    document["environment"]["load_average_at_end"] = os.getloadavg()
    document["complete"] = True
    write_result(out, document)
    return document
