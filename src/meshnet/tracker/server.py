"""Tracker process lifecycle: configuration, start, graceful shutdown, and the command line.

``start_tracker`` wires store → registry → servicer → grpc.aio server and returns a handle;
``serve_tracker`` runs one until SIGTERM/SIGINT (or a stop event) and then drains: health
turns NOT_SERVING first, in-flight calls get ``shutdown_grace_s``, the store closes last.
``add_tracker_arguments`` / ``run_tracker`` are what ``meshnet tracker`` wires in; ``python -m
meshnet.tracker`` runs ``tracker_main`` directly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from meshnet.core.errors import InvalidArgument, MeshnetError, Unavailable
from meshnet.protocol import services
from meshnet.tracker.registry import Clock, NodeRegistry
from meshnet.tracker.service import StoreRunner, TrackerServicer
from meshnet.tracker.store import SqliteTrackerStore

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 1 << 20
"""Tracker messages are small; refusing big ones early bounds what a bad peer can make us parse."""


@dataclass(frozen=True)
class TrackerConfig:
    host: str = "127.0.0.1"
    """Interface to listen on. Loopback by default, so a tracker started without configuration
    is unreachable from the network (S5); use 0.0.0.0 deliberately."""
    port: int = 7070
    """TCP port; 0 lets the OS pick one (see ``RunningTracker.port``)."""
    db_path: Path = Path("tracker.sqlite3")
    """SQLite file holding the epoch, nodes seen and work records; created if missing."""
    heartbeat_interval_s: float = 2.0
    """How often workers are told to heartbeat."""
    missed_heartbeats: int = 3
    """A node silent for this many intervals leaves routes and the epoch increments."""
    session_ttl_s: float = 600.0
    """A session's sticky route is forgotten after this long without a route request."""
    shutdown_grace_s: float = 5.0
    """How long in-flight calls may finish after shutdown starts."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise InvalidArgument(f"port must be in [0, 65535], got {self.port}")
        for name in ("heartbeat_interval_s", "session_ttl_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise InvalidArgument(f"{name} must be a positive number of seconds, got {value}")
        if not (math.isfinite(self.shutdown_grace_s) and self.shutdown_grace_s >= 0):
            raise InvalidArgument(f"shutdown_grace_s must be >= 0, got {self.shutdown_grace_s}")
        if self.missed_heartbeats < 1:
            raise InvalidArgument(f"missed_heartbeats must be >= 1, got {self.missed_heartbeats}")


class RunningTracker:
    """A started tracker: where it listens, and how to stop it."""

    def __init__(
        self,
        config: TrackerConfig,
        server: grpc.aio.Server,
        port: int,
        health_servicer: health.aio.HealthServicer,
        store: StoreRunner,
        sweeper: asyncio.Task[None],
    ) -> None:
        self.config = config
        self.registry: NodeRegistry | None = None
        self.port = port
        self._server = server
        self._health = health_servicer
        self._store = store
        self._sweeper = sweeper
        self._stopped = False

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    async def stop(self, grace_s: float | None = None) -> None:
        """Drain and stop; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        # NOT_SERVING first, so load balancers and health watchers move away before we refuse (G9).
        await self._health.enter_graceful_shutdown()
        self._sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._sweeper
        await self._server.stop(self.config.shutdown_grace_s if grace_s is None else grace_s)
        await asyncio.to_thread(self._store.close)
        logger.info("tracker on %s stopped", self.address)

    async def wait_for_termination(self) -> None:
        await self._server.wait_for_termination()


async def start_tracker(
    config: TrackerConfig, *, clock: Clock = time.monotonic, wall_clock: Clock = time.time
) -> RunningTracker:
    """Open the store, restore the epoch, and start serving on ``config.host:config.port``."""
    store = SqliteTrackerStore(config.db_path)
    # A restart forgets every live node, which is itself a membership change: start one past
    # the stored epoch so no epoch handed out before the crash is ever reused for another view.
    epoch = store.load_epoch() + 1
    store.save_epoch(epoch)
    registry = NodeRegistry(
        clock=clock,
        heartbeat_interval_s=config.heartbeat_interval_s,
        missed_heartbeats=config.missed_heartbeats,
        epoch=epoch,
        session_ttl_s=config.session_ttl_s,
    )
    runner = StoreRunner(store)
    servicer = TrackerServicer(registry, runner, wall_clock)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            # Without this Linux lets a second tracker bind the same port and split the traffic.
            ("grpc.so_reuseport", 0),
        ]
    )
    services.add_tracker_servicer(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    target = f"{config.host}:{config.port}"
    try:
        port = server.add_insecure_port(target)
    except RuntimeError as error:
        runner.close()
        raise Unavailable(f"the tracker cannot listen on {target}: {error}") from error
    await server.start()
    for service in ("", services.TRACKER_SERVICE):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    sweeper = asyncio.create_task(servicer.sweep_forever(config.heartbeat_interval_s / 4))
    logger.info("tracker listening on %s:%d, epoch %d, db %s", config.host, port, epoch, config.db_path)
    running = RunningTracker(config, server, port, health_servicer, runner, sweeper)
    running.registry = registry  # read-only use: inspection in tests and diagnostics
    return running


async def serve_tracker(
    config: TrackerConfig,
    *,
    stop_event: asyncio.Event | None = None,
    on_ready: Callable[[RunningTracker], None] | None = None,
) -> None:
    """Serve until ``stop_event`` is set or the process gets SIGTERM/SIGINT, then drain."""
    running = await start_tracker(config)
    stop = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(signum, stop.set)
            handled.append(signum)
    try:
        if on_ready is not None:
            on_ready(running)
        await stop.wait()
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)
        await running.stop()


def add_tracker_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags for every ``TrackerConfig`` field (``--db`` defaults under ``--data-dir`` if given)."""
    defaults = TrackerConfig()
    parser.add_argument("--host", default=defaults.host, help="interface to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=defaults.port, help="TCP port, 0 = any (default: %(default)s)")
    parser.add_argument(
        "--db",
        type=Path,
        default=None,
        help=f"SQLite file (default: DATA_DIR/tracker.sqlite3 with --data-dir, else ./{defaults.db_path})",
    )
    parser.add_argument(
        "--heartbeat-interval",
        type=float,
        default=defaults.heartbeat_interval_s,
        help="seconds between worker heartbeats (default: %(default)s)",
    )
    parser.add_argument(
        "--missed-heartbeats",
        type=int,
        default=defaults.missed_heartbeats,
        help="heartbeats a node may miss before it leaves routes (default: %(default)s)",
    )
    parser.add_argument(
        "--session-ttl",
        type=float,
        default=defaults.session_ttl_s,
        help="seconds an idle session keeps its sticky route (default: %(default)s)",
    )
    parser.add_argument(
        "--shutdown-grace",
        type=float,
        default=defaults.shutdown_grace_s,
        help="seconds in-flight calls may finish on shutdown (default: %(default)s)",
    )


def config_from_args(args: argparse.Namespace) -> TrackerConfig:
    db_path = args.db
    if db_path is None:
        data_dir = getattr(args, "data_dir", None)
        db_path = Path(data_dir) / "tracker.sqlite3" if data_dir else TrackerConfig().db_path
    return TrackerConfig(
        host=args.host,
        port=args.port,
        db_path=db_path,
        heartbeat_interval_s=args.heartbeat_interval,
        missed_heartbeats=args.missed_heartbeats,
        session_ttl_s=args.session_ttl,
        shutdown_grace_s=args.shutdown_grace,
    )


def run_tracker(args: argparse.Namespace) -> int:
    """Run a tracker from parsed ``add_tracker_arguments`` flags; returns the exit status."""
    try:
        config = config_from_args(args)
        asyncio.run(serve_tracker(config, on_ready=_announce))
    except MeshnetError as error:
        print(f"meshnet tracker: {error.message}", file=sys.stderr)
        return 2
    return 0


def tracker_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="meshnet tracker", description="Run the meshnet tracker.")
    add_tracker_arguments(parser)
    parser.add_argument("--log-level", default="INFO", help="logging level (default: %(default)s)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_tracker(args)


def _announce(running: RunningTracker) -> None:
    # The CLI's own output: scripts and tests wait for this line to learn the bound port.
    print(f"meshnet tracker listening on {running.address}", flush=True)
