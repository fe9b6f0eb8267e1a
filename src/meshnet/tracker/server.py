"""Tracker process lifecycle: configuration, start, graceful shutdown, and the command line.

``start_tracker`` wires store → registry → servicer → grpc.aio server and returns a handle;
``serve_tracker`` runs one until SIGTERM/SIGINT (or a stop event) and then drains: health
turns NOT_SERVING first, in-flight calls get ``shutdown_grace_s``, the store closes last.
``run_tracker`` is what ``meshnet tracker`` runs once the command line built its config.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from meshnet.core.addresses import dialable_address, require_loopback
from meshnet.core.errors import FailedPrecondition, MeshnetError
from meshnet.process.collector import pace_collector
from meshnet.process.ports import PortInUse
from meshnet.telemetry.prometheus import MetricsEndpoint
from meshnet.tracker.artifact_directory import add_artifact_directory
from meshnet.tracker.checked_work import CheckedWork
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.etcd.membership import SharedMembership
from meshnet.tracker.metrics import serve_tracker_metrics
from meshnet.tracker.node_entry import Clock
from meshnet.tracker.registry import NodeRegistry
from meshnet.tracker.revocation_feed import RevocationFeed
from meshnet.tracker.service import TrackerServicer
from meshnet.tracker.status_service import SwarmStatusServicer
from meshnet.tracker.store import TrackerStore
from meshnet.tracker.store_runner import StoreRunner
from meshnet.tracker.stores import describe, open_store, replica_id, shared_invites, shared_membership
from meshnet.tracker.swarm_service import (
    SwarmServicer,
    TrackerSecurity,
    load_tracker_security,
    write_join_address,
)
from meshnet.tracker.work_checks import WorkLedger
from meshnet.wire import services
from meshnet.wire.tls import bind

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 1 << 20
"""Tracker messages are small; refusing big ones early bounds what a bad peer can make us parse."""
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Without this Linux lets a second tracker bind the same port and split the traffic.
    ("grpc.so_reuseport", 0),
    # Clients ping every 10 s while a call is open (TrackerClient): a WatchRevocations stream
    # carries no data for hours, and must find a dead tracker. Accept those pings, or gRPC
    # answers GOAWAY too_many_pings after a few and ends the stream.
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]


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
        revocations: RevocationFeed,
        metrics: MetricsEndpoint | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        """The /metrics endpoint (``--metrics-port``), if served."""
        self.registry: NodeRegistry | None = None
        self.port = port
        self.join_port: int | None = None
        """Where the join service listens (secured trackers only)."""
        self._server = server
        self._health = health_servicer
        self._store = store
        self._sweeper = sweeper
        self._revocations = revocations
        self._stopped = False
        self.join_server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    @property
    def join_address(self) -> str | None:
        return None if self.join_port is None else f"{self.config.host}:{self.join_port}"

    async def stop(self, grace_s: float | None = None) -> None:
        """Drain and stop; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        # NOT_SERVING first, so load balancers and health watchers move away before we refuse (G9).
        await self._health.enter_graceful_shutdown()
        self._revocations.close()  # watches end now, not at the end of the grace
        self._sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._sweeper
        if self.join_server is not None:
            await self.join_server.stop(0)
        await self._server.stop(self.config.shutdown_grace_s if grace_s is None else grace_s)
        await asyncio.to_thread(self._store.close)
        if self.metrics is not None:
            self.metrics.close()
        logger.info("tracker on %s stopped", self.address)

    async def wait_for_termination(self) -> None:
        await self._server.wait_for_termination()


def _restored_registry(store: TrackerStore, config: TrackerConfig, clock: Clock) -> NodeRegistry:
    # A restart forgets every live node, which is itself a membership change: start one past
    # the stored epoch so no epoch handed out before the crash is ever reused for another view.
    epoch = store.load_epoch() + 1
    store.save_epoch(epoch)
    return NodeRegistry(
        clock=clock,
        heartbeat_interval_s=config.heartbeat_interval_s,
        missed_heartbeats=config.missed_heartbeats,
        epoch=epoch,
        session_ttl_s=config.session_ttl_s,
        quarantined=store.quarantined_nodes(),
        mixed_devices=config.allow_mixed_routes,
        plan_staleness_s=config.plan_staleness_s,
    )


async def start_tracker(
    config: TrackerConfig,
    *,
    clock: Clock = time.monotonic,
    wall_clock: Clock = time.time,
    security: TrackerSecurity | None = None,
) -> RunningTracker:
    """Open the store, restore the epoch, and start serving on ``config.host:config.port``.

    With ``security``, the main port requires a swarm client certificate on every call and a
    second port (``join_port``) serves only Join; without, plaintext, and only on loopback.
    """
    if security is None:
        require_loopback((config.host,))
    store = open_store(config)
    # Off the event loop: with an etcd store these are network round trips.
    registry = await asyncio.to_thread(_restored_registry, store, config, clock)
    epoch = registry.epoch
    runner = StoreRunner(store, registry.hearing)
    link = None if security is None else security.link
    feed = RevocationFeed(None if link is None else link.revocations)
    work = None if link is None else _checked_work(config, registry, runner, wall_clock)
    servicer = TrackerServicer(registry, runner, wall_clock, link, feed, work)
    server = grpc.aio.server(options=SERVER_OPTIONS)
    services.add_tracker_servicer(servicer, server)
    add_artifact_directory(server, clock, config.heartbeat_interval_s, config.missed_heartbeats, link)
    services.add_swarm_status_servicer(SwarmStatusServicer(registry, link), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        port, join = _listen(server, config, security, registry, feed, store)
    except RuntimeError as error:
        runner.close()
        # Not Unavailable ([worker_lost]): nothing was lost, the port is taken.
        raise PortInUse(
            f"the tracker cannot listen on {config.host}:{config.port} (join port {config.join_port}; in use?): {error}"
        ) from error
    secured = None if work is None or security is None else (work, security, feed)
    try:  # before serving: a replica whose id another live replica holds must not start
        # (the registry is not served yet: nothing else touches it meanwhile)
        membership = await asyncio.to_thread(shared_membership, store, registry, config, port, secured)
    except MeshnetError:
        runner.close()
        raise
    metrics = _metrics(config, servicer, registry, port)
    await server.start()
    if join is not None:
        await join[0].start()
    for service in ("", services.TRACKER_SERVICE):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    sweeper = asyncio.create_task(_background(servicer, config, security, membership))
    logger.info("tracker serving on %s:%d, epoch %d, %s", config.host, port, epoch, describe(config))
    running = RunningTracker(config, server, port, health_servicer, runner, sweeper, feed, metrics)
    running.registry = registry  # read-only use: inspection in tests and diagnostics
    if join is not None:
        running.join_server, running.join_port = join
    return running


async def _background(
    servicer: TrackerServicer,
    config: TrackerConfig,
    security: TrackerSecurity | None,
    membership: SharedMembership | None,
) -> None:
    """Expiry sweeps, the exchange with other replicas (etcd store), and on a secured tracker
    the freshness of its own certificate."""
    tasks = [servicer.sweep_forever(config.heartbeat_interval_s / 4)]
    if membership is not None:
        tasks.append(membership.run_forever())
    if servicer.work is not None:
        tasks.append(servicer.work.file_from_shards_forever(min(1.0, config.work_grace_s / 4)))
    if security is not None:
        tasks.append(security.keep_own_certificate_fresh())
    await asyncio.gather(*tasks)


def _metrics(
    config: TrackerConfig, servicer: TrackerServicer, registry: NodeRegistry, port: int
) -> MetricsEndpoint | None:
    """The /metrics endpoint, labelled with this replica's id, if ``--metrics-port`` asks for one."""
    if config.metrics_port is None:
        return None
    replica = replica_id(config, port)
    metrics = serve_tracker_metrics(servicer.served, registry.live_count, replica, config.host, config.metrics_port)
    logger.info("tracker replica %s serving metrics on %s", replica, metrics.address)
    return metrics


def _checked_work(config: TrackerConfig, registry: NodeRegistry, runner: StoreRunner, wall_clock: Clock) -> CheckedWork:
    ledger = WorkLedger(grace_s=config.work_grace_s, wall_clock=wall_clock)
    return CheckedWork(ledger, runner.store, runner.call, lambda node: registry.get(node) is not None, wall_clock)


def _listen(
    server: grpc.aio.Server,
    config: TrackerConfig,
    security: TrackerSecurity | None,
    registry: NodeRegistry,
    feed: RevocationFeed,
    store: TrackerStore,
) -> tuple[int, tuple[grpc.aio.Server, int] | None]:
    """Bind the main port (mTLS when secured) and, secured, the join port: (port, join server)."""
    port = bind(server, f"{config.host}:{config.port}", None if security is None else security.link)
    if security is None:
        return port, None
    security.refresh_revocations()
    invites = shared_invites(store, security.authority.key_pem)
    swarm = SwarmServicer(security, registry, feed, shared_invites=invites)
    services.add_swarm_servicer(swarm, server)
    return port, _join_server(config, security, swarm)


def _join_server(config: TrackerConfig, security: TrackerSecurity, swarm: SwarmServicer) -> tuple[grpc.aio.Server, int]:
    """The port a node without a certificate can reach: TLS (server side only), Join only."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 1024), ("grpc.so_reuseport", 0)])
    services.add_swarm_servicer(swarm, server)
    credentials = security.link.server_credentials(require_client_cert=False)
    return server, server.add_secure_port(f"{config.host}:{config.join_port}", credentials)


async def serve_tracker(
    config: TrackerConfig,
    *,
    stop_event: asyncio.Event | None = None,
    on_ready: Callable[[RunningTracker], None] | None = None,
    security: TrackerSecurity | None = None,
) -> None:
    """Serve until ``stop_event`` is set or the process gets SIGTERM/SIGINT, then drain."""
    running = await start_tracker(config, security=security)
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


def run_tracker(config: TrackerConfig, data_dir: Path, on_ready: Callable[[RunningTracker], None]) -> int:
    """Run a tracker until SIGTERM/SIGINT; returns the exit status (``meshnet tracker``, whose
    ``on_ready`` prints the ready line launchers wait for)."""
    security = None if config.insecure else load_tracker_security(data_dir, time.time())

    def announce(running: RunningTracker) -> None:
        if running.join_address is not None:
            write_join_address(data_dir, _invited_address(running.join_address))
        on_ready(running)

    pace_collector()  # full collections stopped a 3,000-node tracker for 250 ms every ~10 s
    asyncio.run(serve_tracker(config, on_ready=announce, security=security))
    return 0


def _invited_address(join_address: str) -> str:
    """What invites carry: on a wildcard bind, the address of the default route's interface. With
    no route (an isolated LAN) the wildcard is kept, and `swarm invite` refuses it naming
    --join-address, rather than the tracker refusing to start."""
    try:
        return dialable_address(join_address, flag="swarm invite --join-address")
    except FailedPrecondition as error:
        logger.warning("%s", error.message)
        return join_address
