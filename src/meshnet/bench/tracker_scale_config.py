"""``meshnet bench-tracker-scale``'s configuration, apart from the measurement so the CLI stays light."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from meshnet.core.addresses import TrackerOrder
from meshnet.core.config_flags import cli
from meshnet.core.errors import InvalidArgument
from meshnet.core.tracking import DEFAULT_HEARTBEAT_TRANSPORT, HeartbeatTransport

TRACKER_START_TIMEOUT_S = 30.0
"""Seconds a started tracker (or the transport experiment's echo server) may take to be ready."""
ScaleMode = Literal["sweep", "mass-join", "soak", "transport", "replica-kill"]


@dataclass(frozen=True)
class TrackerScaleConfig:
    """``meshnet bench-tracker-scale``: one tracker process under simulated nodes and gateway load.

    ``sweep`` measures every nodes x route-rate point (records at the route rate) on a fresh
    tracker each; ``mass-join`` registers every node at once on a fresh tracker and watches the
    aftermath; ``soak`` holds the largest point for ``soak_s``; ``transport`` only compares a
    unary heartbeat with one carried on a long-lived stream (also part of every sweep);
    ``replica-kill`` starts a 3-member etcd cluster and 3 tracker replicas on it and, under the
    largest point's load, SIGKILLs one replica and later the etcd leader (``bench.replica_kill``)."""

    data_dir: Path
    """Where the swarm CA is (created if missing), and the run's tracker databases and logs."""
    mode: ScaleMode = "sweep"
    """sweep: every nodes x route-rate point; mass-join: every node registers at once; soak: the
    largest point for --soak seconds; transport: unary vs streamed heartbeat cost only;
    replica-kill: 3 replicas on 3 etcd members, one of each SIGKILLed under load."""
    nodes: tuple[int, ...] = (100, 300, 1000, 3000)
    """Simulated node counts, one point each."""
    route_rates: tuple[float, ...] = (20.0, 100.0)
    """ChooseRoute calls per second, fresh sessions each; ReportWork runs at the same rate."""
    warmup_s: float = field(default=20.0, metadata=cli("warmup"))
    """Seconds of load before counting starts (joins settle, caches fill)."""
    measure_s: float = field(default=60.0, metadata=cli("measure"))
    """Seconds counted per point (sweep and mass join)."""
    soak_s: float = field(default=1800.0, metadata=cli("soak"))
    """Seconds counted in soak mode, at the largest nodes and route rate given."""
    heartbeat_interval_s: float = field(default=2.0, metadata=cli("heartbeat-interval"))
    """The tracker's heartbeat interval (the real default is 2 s)."""
    n_layers: int = 30
    """Layers of the simulated model; nodes serve ranges of 2-10 of them."""
    kill_tracker_at_s: float = field(default=20.0, metadata=cli("kill-tracker-at"))
    """replica-kill: seconds into the measured span when the first tracker replica is SIGKILLed."""
    kill_store_at_s: float = field(default=40.0, metadata=cli("kill-store-at"))
    """replica-kill: seconds into the measured span when the etcd leader is SIGKILLed."""
    trackers: tuple[str, ...] = ()
    """Addresses of trackers already running (replicas, started by whoever kills one under load):
    none are started, nodes spread over them and fail over. Empty: start one per point."""
    tracker_order: TrackerOrder = "spread"
    """How the simulated nodes and gateway order --trackers replicas: spread (each its own, as
    workers and gateways do) or listed (all start at the first, as before they spread)."""
    tracker_core: int = 0
    """CPU core the started tracker is pinned to (taskset)."""
    generator_cores: tuple[int, ...] = (1,)
    """CPU cores the load generator processes are pinned to, round robin."""
    generator_processes: int = 1
    """Load generator processes sharing each point's nodes and rates (one event loop keeps up
    with about 1,000 nodes on one core; give more cores and processes for more)."""
    heartbeat_transport: HeartbeatTransport = DEFAULT_HEARTBEAT_TRANSPORT
    """How the simulated nodes heartbeat: stream (one long-lived stream each, as workers do) or
    unary (one call per beat, as workers did before issue 36), to compare both on the tracker."""
    insecure: bool = False
    """Plaintext tracker (no mTLS, no dial-back): only to separate the cost of TLS."""
    out_dir: Path = field(default=Path("bench/results/tracker_scale"), metadata=cli("out-dir"))
    """Folder the JSON result is written to."""
    label: str = ""
    """Name of the result file (default: the mode and the UTC time)."""
    quick: bool = False
    """A few seconds at 10 nodes and 0.2 s heartbeats: the shape of a run, for CI (overrides the
    nodes, rates, spans and interval)."""

    def __post_init__(self) -> None:
        if not self.nodes or min(self.nodes) < 1:
            raise InvalidArgument("--nodes needs at least one positive node count")
        if not self.route_rates or min(self.route_rates) < 0:
            raise InvalidArgument("--route-rates needs at least one rate >= 0")
        for name in ("warmup_s", "measure_s", "soak_s", "heartbeat_interval_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= (0 if name == "warmup_s" else 0.01)):
                raise InvalidArgument(f"{name} must be a finite number of seconds, got {value}")
        if self.generator_processes < 1 or not self.generator_cores:
            raise InvalidArgument("at least one generator process on at least one core")
        if self.mode == "replica-kill" and not 0 <= self.kill_tracker_at_s <= self.kill_store_at_s < self.measure_s:
            raise InvalidArgument("replica-kill: 0 <= --kill-tracker-at <= --kill-store-at < --measure")
        if self.n_layers < 2:
            raise InvalidArgument(f"n_layers must be at least 2, got {self.n_layers}")
