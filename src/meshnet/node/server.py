"""Start, serve and stop one shard worker.

Start-up order: certify the pinned llama.cpp (refuse to serve if split execution is not
bit-identical), load the slice, measure speed, listen, then register with the tracker (the
building is ``assembly.assemble_worker``). Shutdown (SIGTERM/SIGINT): health goes NOT_SERVING
and new sessions are refused at once, in-flight sessions get ``drain_grace`` seconds to finish,
then every session's KV is freed and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from grpc_health.v1 import health_pb2

from meshnet.artifact.directory import Advertisement
from meshnet.core.ids import NodeId
from meshnet.core.tracking import NodeLoad, Registered
from meshnet.fetch.holders import announce_forever
from meshnet.membership.join import renew_forever
from meshnet.membership.tracker_client import TrackerClient, heartbeat_loop
from meshnet.moe.front import ExpertGroupBackend
from meshnet.node.assembly import AssembledWorker, assemble_worker
from meshnet.node.auto_layers import resolve_layers
from meshnet.node.config import WorkerConfig
from meshnet.node.peers import PeerProber
from meshnet.node.shard import AnyShard
from meshnet.route.shard_stream import ChannelPool
from meshnet.telemetry.prometheus import build_registry, serve_metrics
from meshnet.wire import services
from meshnet.wire.tls import LinkSecurity

log = logging.getLogger(__name__)
SWEEP_SECONDS = 5.0
GROUP_WATCH_S = 0.2
"""How often a front checks whether its expert group broke (it then leaves within this)."""


@dataclass(frozen=True)
class WorkerReady:
    address: str
    node_id: NodeId
    fingerprint: str
    metrics_address: str | None = None
    layers: str = ""
    """The range served, as A:B (what ``--layers auto`` resolved to)."""


async def serve_worker(
    config: WorkerConfig,
    *,
    on_ready: Callable[[WorkerReady], None] | None = None,
    stop: asyncio.Event | None = None,
    security: LinkSecurity | None = None,
    on_registered: Callable[[Registered], None] | None = None,
) -> None:
    config = await resolve_layers(config, security)
    worker = await assemble_worker(config, security)
    stop = stop or asyncio.Event()
    record, node_id = worker.registration, worker.shard.node_id
    probes = ChannelPool(config.max_frame_bytes, security)
    metrics_server: WSGIServer | None = None
    metrics_address: str | None = None
    background: list[asyncio.Task[None]] = []
    try:
        await worker.server.start()
        for service in ("", services.SHARD_SERVICE):
            await worker.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        _install_signal_handlers(stop)
        background = _start_background(worker, probes, stop, on_registered)
        if worker.expert_group is not None:
            background.append(asyncio.create_task(_leave_when_broken(worker.expert_group, stop)))
        if config.metrics_port is not None:
            metrics_server, metrics_address = _serve_metrics(worker.shard, config)
        log.info(
            "shard %s serving layers %s on %s (recipe %s)",
            node_id,
            config.layers,
            record.address,
            record.fingerprint,
        )
        if on_ready is not None:
            on_ready(WorkerReady(record.address, node_id, record.fingerprint, metrics_address, str(config.layers)))
        await stop.wait()
    finally:
        await _drain(worker, config.drain_grace)
        for task in background:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, timeout=3.0)
        await _release(worker, probes, metrics_server)
    if worker.expert_group is not None and worker.expert_group.failure is not None:
        raise worker.expert_group.failure  # the process exits with the group's error: re-form it


async def _leave_when_broken(group: ExpertGroupBackend, stop: asyncio.Event) -> None:
    """Stop serving (drain, deregister, exit) once the fronted expert group broke: its nodes
    refuse every later step, so staying registered would only fail every request routed here."""
    while not stop.is_set():
        if group.broken.is_set():
            log.error("leaving the swarm: %s", group.failure.message if group.failure else "the expert group broke")
            stop.set()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=GROUP_WATCH_S)


async def _release(worker: AssembledWorker, probes: ChannelPool, metrics_server: WSGIServer | None) -> None:
    """Free every session's KV, close every channel and listener, stop the engine."""
    await worker.shard.close()
    await worker.links.close()
    await probes.close()
    await worker.server.stop(grace=1.0)
    if metrics_server is not None:
        metrics_server.shutdown()
    await asyncio.to_thread(worker.loop.stop)


def _start_background(
    worker: AssembledWorker,
    probes: ChannelPool,
    stop: asyncio.Event,
    on_registered: Callable[[Registered], None] | None = None,
) -> list[asyncio.Task[None]]:
    """Expiry sweeps and, with a tracker, heartbeats and the probing of candidate next hops."""
    tasks = [asyncio.create_task(_sweep(worker.shard, stop))]
    if worker.config.tracker and worker.held_artifacts is not None:
        tasks.append(
            asyncio.create_task(_announce(worker.config.tracker, worker.held_artifacts, stop, worker.security))
        )
    if worker.config.tracker:
        prober = PeerProber(probes)
        shard = worker.shard

        def load() -> NodeLoad:
            metrics = shard.metrics()
            return metrics.node_load(prober.latest())

        security = worker.security
        tracker = TrackerClient(worker.config.tracker, security=security)
        heartbeats = heartbeat_loop(
            tracker,
            worker.registration,
            load,
            stop,
            on_registered=on_registered,
            on_epoch=shard.raise_min_epoch,
            on_probe=prober.set_targets,
            # Revoked certificates are refused from the next call on, within one heartbeat.
            on_revoked=None if security is None else security.revocations.replace,
        )
        tasks += [asyncio.create_task(prober.run(stop)), asyncio.create_task(heartbeats)]
        if security is not None:
            tasks.append(asyncio.create_task(renew_forever(worker.config.tracker, security, stop)))
    return tasks


async def _announce(tracker: str, held: Advertisement, stop: asyncio.Event, security: LinkSecurity | None) -> None:
    """Keep the artifacts this worker holds announced until it stops."""
    announcer = asyncio.create_task(announce_forever(tracker, held, security))
    await stop.wait()
    announcer.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await announcer


def _serve_metrics(shard: AnyShard, config: WorkerConfig) -> tuple[WSGIServer, str]:
    """Prometheus ``/metrics`` over the same figures GetMetrics and the heartbeat report."""
    registry = build_registry("meshnet_worker", lambda: shard.metrics().values(), {"layers": str(config.layers)})
    server, port = serve_metrics(registry, config.host, config.metrics_port or 0)
    return server, f"{config.host}:{port}"


async def _sweep(shard: AnyShard, stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=SWEEP_SECONDS)
        expired = await shard.expire_idle()
        if expired:
            log.info("expired %d idle session(s)", expired)


async def _drain(worker: AssembledWorker, grace: float) -> None:
    shard = worker.shard
    shard.start_draining()
    await worker.health.enter_graceful_shutdown()
    deadline = asyncio.get_running_loop().time() + grace
    while shard.open_sessions and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    if shard.open_sessions:
        log.warning("releasing %d session(s) still open after %.0f s of drain", shard.open_sessions, grace)


def _install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
