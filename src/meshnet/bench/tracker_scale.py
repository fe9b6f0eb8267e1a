"""The tracker-scale benchmark: a real tracker process under N simulated nodes and gateway load.

Every point starts a fresh ``meshnet tracker`` (mTLS as shipped, its own database) pinned to
one core, and the load generator (``membership.load_generator``) pinned to another, as two
processes so neither's CPU hides in the other's. The generator does the counting; this module
lays out the points, starts and stops the processes, and writes one JSON file
(``SCHEMA``) with the machine it ran on: cores, CPU, commit and the load average before and
after each point (a shared machine makes the numbers indicative, and the file says how shared).
A point whose generator fell behind is kept, marked invalid with the reason; a point whose
processes failed is kept with the error. Nothing is dropped silently.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from meshnet.bench.environment import cpu_model, runtime_versions
from meshnet.bench.heartbeat_transport_run import measure_transports
from meshnet.bench.pinning import pinned
from meshnet.bench.tracker_scale_config import TRACKER_START_TIMEOUT_S, TrackerScaleConfig
from meshnet.bench.tracker_scale_merge import merge_points
from meshnet.core.errors import MeshnetError
from meshnet.deploy.launch.commands import tracker_launch
from meshnet.deploy.launch.ready_lines import TrackerLine
from meshnet.membership.load_generator import LoadSpec
from meshnet.process.launcher import ChildProcess, LaunchSpec
from meshnet.security.swarm_dir import ensure_swarm
from meshnet.tracker.config import TrackerConfig

SCHEMA = "meshnet.bench.tracker_scale/1"
GENERATOR_SLACK_S = 180.0
"""Beyond warm-up and the measured span: minting certificates, binding ports, joining, stopping."""

Say = Callable[[str], None]


def git_commit(folder: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
    except OSError:
        return None
    return done.stdout.strip() or None


def environment(config: TrackerScaleConfig) -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "usable_cores": sorted(os.sched_getaffinity(0)),
        "cpu_model": cpu_model(),
        "commit": git_commit(Path(__file__).resolve().parent),
        "versions": runtime_versions(),
        "load_average_at_start": os.getloadavg(),
        "tracker_core": config.tracker_core,
        "generator_cores": list(config.generator_cores),
        "generator_processes": config.generator_processes,
    }


@dataclass(frozen=True)
class LoadPoint:
    nodes: int
    route_rate: float
    """ChooseRoute calls per second; ReportWork runs at the same rate."""
    mass_join: bool
    warmup_s: float
    measure_s: float


def load_points(config: TrackerScaleConfig) -> list[LoadPoint]:
    """Each point the mode asks for."""
    top_rate = max(config.route_rates)
    if config.mode == "sweep":
        return [
            LoadPoint(n, rate, False, config.warmup_s, config.measure_s)
            for n in config.nodes
            for rate in config.route_rates
        ]
    if config.mode == "mass-join":
        # No warm-up: what a mass join does is in the first intervals after it.
        return [LoadPoint(n, top_rate, True, 0.0, config.measure_s) for n in config.nodes]
    if config.mode == "soak":
        return [LoadPoint(max(config.nodes), top_rate, False, config.warmup_s, config.soak_s)]
    return []


class TrackerScaleRun:
    """The processes of one run: a tracker per point (unless replicas were given) and a generator."""

    def __init__(self, config: TrackerScaleConfig, say: Say) -> None:
        self.config = config
        self.say = say
        self.run_dir = config.data_dir / "tracker-scale" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def start_tracker(
        self, name: str, store: str = "", data_dir: Path | None = None
    ) -> tuple[ChildProcess, str | None]:
        """A tracker pinned to the tracker core; a replica named ``name`` when ``store`` is etcd's."""
        tracker = TrackerConfig(
            port=0,
            join_port=0,
            db_path=self.run_dir / f"{name}.sqlite3",
            heartbeat_interval_s=self.config.heartbeat_interval_s,
            insecure=self.config.insecure,
            store=store,
            replica_id=name if store else "",
        )
        launch = tracker_launch(tracker, self.config.data_dir)
        command, unpinned = pinned(launch.argv, self.config.tracker_core)
        log = self.run_dir / f"{name}.log"
        child = ChildProcess(LaunchSpec(name, command, log, TrackerLine.PREFIX, dict(launch.environment)))
        child.await_ready(time.monotonic() + TRACKER_START_TIMEOUT_S)
        return child, unpinned

    def generate(self, specs: list[LoadSpec], name: str) -> dict[str, Any]:
        """Run one generator process per spec at once (pinned round robin over the generator
        cores); their summaries merged, or the error of the first that failed."""
        running = []
        not_pinned: list[str] = []
        for index, spec in enumerate(specs):
            spec_path = self.run_dir / f"{name}.{index}.spec.json"
            spec_path.write_text(json.dumps(spec.to_json()))
            core = self.config.generator_cores[index % len(self.config.generator_cores)]
            command, unpinned = pinned(
                (sys.executable, "-m", "meshnet.membership.load_generator", str(spec_path)), core
            )
            if unpinned is not None:
                not_pinned.append(f"generator {index}: {unpinned}")
            log_path = self.run_dir / f"{name}.{index}.generator.log"
            with log_path.open("w") as log:
                process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
            running.append((process, log_path))
        spec = specs[0]
        deadline = time.monotonic() + spec.warmup_s + spec.measure_s + GENERATOR_SLACK_S + spec.nodes / 50
        results: list[dict[str, Any]] = []
        failure: dict[str, Any] | None = None
        for process, log_path in running:
            try:
                stdout, _ = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                stdout, _ = process.communicate()
            lines = stdout.strip().splitlines()
            if process.returncode != 0 or not lines:
                tail = log_path.read_text(errors="replace")[-2000:]
                failure = failure or {"error": f"a load generator exited {process.returncode}", "log_tail": tail}
            else:
                results.append(json.loads(lines[-1]))
        return {**(failure or merge_points(results)), "generators_not_pinned": not_pinned}

    def specs(self, addresses: tuple[str, ...], tracker_pid: int | None, point: LoadPoint) -> list[LoadSpec]:
        """The point's nodes and rates shared out over ``generator_processes`` generators."""
        processes = min(self.config.generator_processes, point.nodes)
        shares = [point.nodes // processes + (index < point.nodes % processes) for index in range(processes)]
        return [
            LoadSpec(
                trackers=addresses,
                data_dir=None if self.config.insecure else self.config.data_dir,
                nodes=share,
                routes_per_s=point.route_rate / processes,
                records_per_s=point.route_rate / processes,
                warmup_s=point.warmup_s,
                measure_s=point.measure_s,
                mass_join=point.mass_join,
                join_spread_s=self.config.heartbeat_interval_s,
                n_layers=self.config.n_layers,
                tracker_pid=tracker_pid,
                seed=index,
                heartbeat_transport=self.config.heartbeat_transport,
                tracker_order=self.config.tracker_order,
            )
            for index, share in enumerate(shares)
        ]

    def point(self, point: LoadPoint) -> dict[str, Any]:
        name = f"{'join' if point.mass_join else 'load'}-{point.nodes}n-{point.route_rate:g}rps"
        self.say(f"{name}: {point.warmup_s:g} s warm-up, {point.measure_s:g} s measured")
        load_before = os.getloadavg()
        tracker: ChildProcess | None = None
        unpinned: str | None = None
        try:
            if self.config.trackers:
                addresses = self.config.trackers
            else:
                tracker, unpinned = self.start_tracker(name)
                addresses = (tracker.ready.first if tracker.ready else "",)
            result = self.generate(self.specs(addresses, None if tracker is None else tracker.pid, point), name)
        except (MeshnetError, OSError, subprocess.TimeoutExpired) as error:
            result = {"error": f"{type(error).__name__}: {error}"}
        finally:
            if tracker is not None:
                tracker.stop()
        result.update(
            name=name,
            tracker_unpinned=unpinned,
            load_average_before=load_before,
            load_average_after=os.getloadavg(),
        )
        self.say(_line(result))
        return result


def _line(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"  {result['name']}: FAILED {result['error']}"
    calls = result["calls"]
    return (
        f"  {result['name']}: heartbeat p50/p99 {calls['heartbeat']['p50_ms']}/{calls['heartbeat']['p99_ms']} ms, "
        f"route {calls['choose_route']['p50_ms']}/{calls['choose_route']['p99_ms']} ms, "
        f"record {calls['report_work']['p50_ms']}/{calls['report_work']['p99_ms']} ms, "
        f"wrongly expired {result['live_nodes_wrongly_expired']}, tracker {result['tracker']['cpu_cores']} cores, "
        f"errors {sum(result['errors'].values())}{'' if result['valid'] else ' INVALID: ' + result['invalid_reason']}"
    )


def result_path(config: TrackerScaleConfig) -> Path:
    label = config.label or f"{config.mode}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    return config.out_dir / f"{label}.json"


def write_result(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(document, indent=1) + "\n")
    partial.replace(path)


def new_document(config: TrackerScaleConfig) -> dict[str, Any]:
    """A run's result before its points (``complete`` false), the swarm CA made if missing."""
    if not config.insecure:
        ensure_swarm(config.data_dir, time.time())
    return {
        "schema": SCHEMA,
        "mode": config.mode,
        "complete": False,
        "measured_at_unix_s": time.time(),
        "environment": environment(config),
        "config": {key: str(value) if isinstance(value, Path) else value for key, value in asdict(config).items()},
        "points": [],
    }


def measure_tracker_scale(config: TrackerScaleConfig, out: Path, say: Say = print) -> dict[str, Any]:
    """Every point the mode asks for, plus the heartbeat transport comparison; the whole result,
    written to ``out`` after every point (``complete`` false until the end), so a run that
    fails half-way keeps what it measured."""
    document = new_document(config)
    run = TrackerScaleRun(config, say)
    for point in load_points(config):
        document["points"].append(run.point(point))
        write_result(out, document)
    if config.mode in ("sweep", "transport"):
        document["heartbeat_transport"] = measure_transports(config, run.run_dir, say)
    document["environment"]["load_average_at_end"] = os.getloadavg()
    document["complete"] = True
    write_result(out, document)
    return document


def quick(config: TrackerScaleConfig) -> TrackerScaleConfig:
    """A few seconds at a handful of nodes: the shape of a run, for CI."""
    return replace(
        config,
        nodes=(10,),
        route_rates=(5.0,),
        warmup_s=1.0,
        measure_s=2.0,
        heartbeat_interval_s=0.2,
        kill_tracker_at_s=0.5,
        kill_store_at_s=1.0,
    )
