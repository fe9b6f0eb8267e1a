"""Serve one shard worker: its lifecycle from start to exit (start, serve, drain, stop).

Start-up order: certify the pinned llama.cpp (refuse to serve if split execution is not
bit-identical), load the slice, measure speed, listen (the building is
``assembly.assemble_worker``), go SERVING, then run beside the server: the tracker membership
(``membership_tasks``), idle-session expiry, the metrics endpoint (``metrics_server``) and, for a
group front, the watch on its expert group. Shutdown (SIGTERM/SIGINT, a stop event, or a broken
expert group): health goes NOT_SERVING and new sessions are refused at once, in-flight sessions
get ``drain_grace`` seconds to finish, then every session's KV is freed and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass

from grpc_health.v1 import health_pb2

from meshnet.core.ids import NodeId
from meshnet.core.tracking import Registered
from meshnet.moe.front import ExpertGroupBackend
from meshnet.node.assembly import AssembledWorker, assemble_worker
from meshnet.node.auto_layers import resolve_layers
from meshnet.node.config import WorkerConfig
from meshnet.node.membership_tasks import keep_membership
from meshnet.node.metrics_server import serve_worker_metrics
from meshnet.node.shard import AnyShard
from meshnet.telemetry.prometheus import MetricsEndpoint
from meshnet.wire import services
from meshnet.wire.tls import LinkSecurity

log = logging.getLogger(__name__)
SWEEP_SECONDS = 5.0
GROUP_WATCH_S = 0.2
"""How often a front checks whether its expert group broke (it then leaves within this)."""
TASKS_EXIT_S = 3.0
"""How long the background tasks get to finish after stop (deregistering takes one call)."""


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
    metrics: MetricsEndpoint | None = None
    background: list[asyncio.Task[None]] = []
    try:
        await _start_serving(worker)
        _install_signal_handlers(stop)
        background = _start_background(worker, stop, on_registered)
        if config.metrics_port is not None:
            metrics = serve_worker_metrics(worker.shard, config)
        _report_ready(worker, metrics, on_ready)
        await stop.wait()
    finally:
        await _drain(worker, config.drain_grace)
        for task in background:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, timeout=TASKS_EXIT_S)
        await _release(worker, metrics)
    if worker.expert_group is not None and worker.expert_group.failure is not None:
        raise worker.expert_group.failure  # the process exits with the group's error: re-form it


async def _start_serving(worker: AssembledWorker) -> None:
    await worker.server.start()
    for service in ("", services.SHARD_SERVICE):
        await worker.health.set(service, health_pb2.HealthCheckResponse.SERVING)


def _start_background(
    worker: AssembledWorker, stop: asyncio.Event, on_registered: Callable[[Registered], None] | None
) -> list[asyncio.Task[None]]:
    """What runs beside the server until ``stop``: expiry sweeps, membership, the group watch."""
    tasks = [
        asyncio.create_task(_sweep(worker.shard, stop), name="sweeps"),
        asyncio.create_task(keep_membership(worker, stop, on_registered), name="membership"),
    ]
    if worker.expert_group is not None:
        tasks.append(asyncio.create_task(_leave_when_broken(worker.expert_group, stop), name="group-watch"))
    return tasks


def _report_ready(
    worker: AssembledWorker, metrics: MetricsEndpoint | None, on_ready: Callable[[WorkerReady], None] | None
) -> None:
    record, node_id, layers = worker.registration, worker.shard.node_id, worker.config.layers
    log.info("shard %s serving layers %s on %s (recipe %s)", node_id, layers, record.address, record.fingerprint)
    if on_ready is not None:
        metrics_address = None if metrics is None else metrics.address
        on_ready(WorkerReady(record.address, node_id, record.fingerprint, metrics_address, str(layers)))


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


async def _sweep(shard: AnyShard, stop: asyncio.Event) -> None:
    """Free the sessions idle past their TTL, every SWEEP_SECONDS."""
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


async def _release(worker: AssembledWorker, metrics: MetricsEndpoint | None) -> None:
    """Free every session's KV, close every channel and listener, stop the engine."""
    await worker.shard.close()
    await worker.links.close()
    await worker.server.stop(grace=1.0)
    if metrics is not None:
        metrics.close()
    await asyncio.to_thread(worker.loop.stop)


def _install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
