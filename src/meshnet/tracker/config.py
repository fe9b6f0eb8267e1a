"""The tracker's one typed configuration; ``meshnet tracker``'s flags are generated from it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from meshnet.core.config_flags import cli
from meshnet.core.durations import Seconds
from meshnet.core.errors import InvalidArgument
from meshnet.tracker.etcd.retention import DEFAULT_RETENTION_S, RetentionPolicy

DEFAULT_DB_NAME = "tracker.sqlite3"
"""The database's file name inside ``--data-dir`` when ``--db`` is not given."""


@dataclass(frozen=True)
class TrackerConfig:
    host: str = "127.0.0.1"
    """Interface to listen on. Loopback by default, so a tracker started without configuration
    is unreachable from the network (S5); use 0.0.0.0 deliberately."""
    port: int = 7070
    """TCP port; 0 lets the OS pick one (see ``RunningTracker.port``)."""
    db_path: Path = field(
        default=Path(DEFAULT_DB_NAME), metadata=cli("db", shown_default="DATA_DIR/" + DEFAULT_DB_NAME)
    )
    """SQLite file holding the epoch, nodes seen and work records; created if missing."""
    store: str = ""
    """Where replicas of this tracker share their state: ``etcd://HOST:PORT[,HOST:PORT...]``
    naming the members of an etcd 3.4 cluster (``tracker.etcd``). Empty: the SQLite file
    (``--db``), one tracker process, nothing else to run."""
    replica_id: str = ""
    """This replica's name among the replicas sharing ``--store`` (empty: HOST:PORT)."""
    work_retention_s: Seconds = field(default=Seconds(DEFAULT_RETENTION_S), metadata=cli("work-retention"))
    """With ``--store etcd://``: seconds (or 12h, 7d) a work record and its dispute are kept
    before etcd deletes them (``tracker.etcd.retention``); a record reported again after that is
    stored again, so keep it far longer than any client's retry window. The SQLite file keeps
    records for ever."""
    heartbeat_interval_s: float = field(default=2.0, metadata=cli("heartbeat-interval"))
    """Seconds between the heartbeats workers are told to send."""
    missed_heartbeats: int = 3
    """A node silent for this many intervals leaves routes and the epoch increments."""
    plan_staleness_s: float = field(default=0.5, metadata=cli("plan-staleness"))
    """Seconds a cached route plan may stay in use after a node off it may have got cheaper (room
    again, a shorter queue, a new node): without it a busy swarm replans on nearly every route.
    A plan is never used after one of its own nodes filled up, slowed or left (``PlanCache``);
    0 replans at once."""
    session_ttl_s: float = field(default=600.0, metadata=cli("session-ttl"))
    """Seconds after which a session's sticky route is forgotten without a route request."""
    shutdown_grace_s: float = field(default=5.0, metadata=cli("shutdown-grace"))
    """Seconds in-flight calls may take to finish after shutdown starts."""
    work_grace_s: float = field(default=30.0, metadata=cli("work-grace"))
    """Seconds a routed request's shards stay quiet, with no record from its gateway, before the
    tracker files the record from their counts (``completed_by_shards``; secured trackers)."""
    metrics_port: int | None = None
    """Serve Prometheus /metrics on this port (0 picks one), every figure labelled with this
    replica's id (``tracker.metrics``); none serves none."""
    join_port: int = 7071
    """TCP port of the join service: TLS without a client certificate, serving only Join (0: any)."""
    insecure: bool = False
    """Plaintext, unauthenticated gRPC and no join port: loopback development only."""
    allow_mixed_routes: bool = False
    """Chain shards of one model on different device classes (a CUDA head, a CPU tail) when no
    one class covers it: such a route is not bit-identical to either device's whole model, so it
    is served only with this opt-in, only over GPU nodes that measured their drift from the CPU,
    and labelled ``mixed`` with that drift in the request's telemetry."""

    def __post_init__(self) -> None:
        if self.store and not self.store.startswith("etcd://"):
            raise InvalidArgument(f"--store must be empty (SQLite) or etcd://HOST:PORT[,...], got {self.store!r}")
        for name in ("port", "join_port", "metrics_port"):
            if getattr(self, name) is not None and not 0 <= getattr(self, name) <= 65535:
                raise InvalidArgument(f"{name} must be in [0, 65535], got {getattr(self, name)}")
        for name in ("heartbeat_interval_s", "session_ttl_s", "work_grace_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise InvalidArgument(f"{name} must be a positive number of seconds, got {value}")
        if not (math.isfinite(self.shutdown_grace_s) and self.shutdown_grace_s >= 0):
            raise InvalidArgument(f"shutdown_grace_s must be >= 0, got {self.shutdown_grace_s}")
        if not (math.isfinite(self.plan_staleness_s) and self.plan_staleness_s >= 0):
            raise InvalidArgument(f"plan_staleness_s must be >= 0 seconds, got {self.plan_staleness_s}")
        RetentionPolicy(self.work_retention_s)  # InvalidArgument if it is not a duration etcd can keep
        if self.missed_heartbeats < 1:
            raise InvalidArgument(f"missed_heartbeats must be >= 1, got {self.missed_heartbeats}")
