"""Start, serve and stop one shard worker.

Start-up order: certify the pinned llama.cpp (refuse to serve if split execution is not
bit-identical), load the slice, measure speed, listen, then register with the tracker. Shutdown
(SIGTERM/SIGINT): health goes NOT_SERVING and new sessions are refused at once, in-flight
sessions get ``drain_grace`` seconds to finish, then every session's KV is freed and the
process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, replace

import grpc
import grpc.aio
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.client.shard_stream import ChannelPool, channel_options
from meshnet.client.tracker_client import TrackerClient, heartbeat_loop
from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId
from meshnet.core.recipe import Recipe
from meshnet.core.tracking import HardwareSummary, NodeLoad, NodeRegistration
from meshnet.engine.backend import Backend
from meshnet.engine.certification import certify_llama_engine
from meshnet.engine.fake_backend import FakeBackend
from meshnet.engine.llama_backend import LlamaConfig
from meshnet.engine.llama_ffi import LLAMA_CPP_PYTHON_VERSION
from meshnet.engine.shards import open_llama_shard
from meshnet.protocol.generated import shard_pb2_grpc
from meshnet.session.admission import AdmissionPolicy, CapacityPlan, kv_bytes_per_session, plan_capacity
from meshnet.session.engine_loop import EngineLoop
from meshnet.session.table import SessionTable
from meshnet.telemetry.prometheus import build_registry, serve_metrics
from meshnet.worker.calibrate import ShardSpeed, measure_speed
from meshnet.worker.config import FakeModel, WorkerConfig
from meshnet.worker.peers import PeerProber
from meshnet.worker.runtime import ShardIdentity, ShardRuntime
from meshnet.worker.servicer import ShardServicer

log = logging.getLogger(__name__)
SWEEP_SECONDS = 5.0


@dataclass(frozen=True)
class WorkerReady:
    address: str
    node_id: NodeId
    fingerprint: str
    metrics_address: str | None = None


def backend_label(config: WorkerConfig) -> str:
    # Settings that change llama.cpp's arithmetic are part of the recipe identity.
    return f"llama.cpp(flash_attn={'on' if config.flash_attn else 'off'},prefill_chunk={config.prefill_chunk})"


def fake_recipe(fake: FakeModel) -> Recipe:
    return Recipe(
        model_sha256="fake",
        architecture="fake",
        adapter_version="1",
        weight_quantization="none",
        activation_dtype="f32",
        kv_dtype="none",
        backend="fake",
        backend_version="1",
        n_layers=fake.n_layers,
        n_embd=fake.n_embd,
    )


def build_recipe(config: WorkerConfig, source_sha256: str) -> tuple[Recipe, str, str]:
    description = describe_model(config.model)  # type: ignore[arg-type]
    recipe = Recipe(
        model_sha256=source_sha256,
        architecture=description.architecture,
        adapter_version=description.adapter_version,
        weight_quantization=description.quantization,
        activation_dtype="f32",
        kv_dtype="f16",
        backend=backend_label(config),
        backend_version=LLAMA_CPP_PYTHON_VERSION,
        n_layers=description.n_layers,
        n_embd=description.n_embd,
    )
    return recipe, config.model_name or description.name, description.quantization


async def serve_worker(
    config: WorkerConfig, *, on_ready: Callable[[WorkerReady], None] | None = None, stop: asyncio.Event | None = None
) -> None:
    cache = SliceCache(config.data_dir / "cache")
    capacity = await asyncio.to_thread(plan_worker_capacity, config, cache)
    engine_config = LlamaConfig(
        n_threads=config.threads,
        max_slots=capacity.max_sessions,
        n_ctx_per_slot=config.n_ctx_per_session,
        max_batch_tokens=config.prefill_chunk,
        flash_attn=config.flash_attn,
    )

    def open_backend() -> Backend:
        if config.fake is not None:
            fake = config.fake
            return FakeBackend(
                config.layers,
                fake.n_layers,
                n_embd=fake.n_embd,
                n_vocab=fake.n_vocab,
                max_slots=capacity.max_sessions,
                n_ctx_per_slot=config.n_ctx_per_session,
                max_batch_tokens=config.prefill_chunk,
                step_delay=fake.step_delay,
            )
        # Fail closed: CertificationFailed propagates and the worker never listens.
        if config.model is None:
            raise InvalidArgument("a worker needs --model (or a fake model)")
        certify_llama_engine(model=config.model)  # the family and weight types it will serve
        return open_llama_shard(config.model, config.layers, cache, engine_config)

    loop = EngineLoop(open_backend)
    # Starting the loop certified the engine or raised: a worker that serves is certified.
    await asyncio.to_thread(loop.start)
    speed = await loop.call(measure_speed)
    if config.fake is not None:
        recipe, model_name, quantization = fake_recipe(config.fake), config.model_name or "fake", "none"
    else:
        recipe, model_name, quantization = build_recipe(config, cache.source_sha256(config.model))  # type: ignore[arg-type]
    table = SessionTable(
        AdmissionPolicy(capacity.max_sessions, config.max_queue, config.evict_idle_after, config.session_ttl)
    )
    server = grpc.aio.server(options=channel_options(config.max_frame_bytes))
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    address = config.advertise or f"{config.host}:{port}"
    node_id = NodeId(f"shard-{config.layers.start}-{config.layers.stop}-{port}")
    identity = ShardIdentity(
        node_id,
        address,
        recipe.fingerprint(),
        recipe.backend,
        recipe.backend_version,
        certified=True,
        max_frame_bytes=config.max_frame_bytes,
    )
    runtime = ShardRuntime(identity, loop, table, capacity)
    health = HealthServicer()
    shard_pb2_grpc.add_ShardServicer_to_server(ShardServicer(runtime), server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    await health.set("meshnet.v1.Shard", health_pb2.HealthCheckResponse.SERVING)
    stop = stop or asyncio.Event()
    _install_signal_handlers(stop)
    background = [asyncio.create_task(_sweep(runtime, stop))]
    probe_pool = ChannelPool(config.max_frame_bytes)
    if config.tracker:
        registration = _registration(config, address, recipe, model_name, quantization, speed, capacity.max_sessions)
        tracker = TrackerClient(config.tracker)
        prober = PeerProber(probe_pool)
        background.append(asyncio.create_task(prober.run(stop)))
        background.append(
            asyncio.create_task(
                heartbeat_loop(
                    tracker,
                    registration,
                    lambda: replace(_load(runtime), peer_rtt_ms=prober.latest()),
                    stop,
                    on_epoch=_epoch_setter(table),
                    on_probe=prober.set_targets,
                )
            )
        )
    metrics_server, metrics_address = None, None
    if config.metrics_port is not None:
        registry = build_registry("meshnet_worker", runtime.metrics, {"layers": str(config.layers)})
        metrics_server, metrics_port = serve_metrics(registry, config.host, config.metrics_port)
        metrics_address = f"{config.host}:{metrics_port}"
    log.info("shard %s serving layers %s on %s (recipe %s)", node_id, config.layers, address, identity.fingerprint)
    if on_ready is not None:
        on_ready(WorkerReady(address, node_id, identity.fingerprint, metrics_address))
    try:
        await stop.wait()
    finally:
        await _drain(runtime, health, config.drain_grace)
        for task in background:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, timeout=3.0)
        await runtime.close()
        await probe_pool.close()
        await server.stop(grace=1.0)
        if metrics_server is not None:
            metrics_server.shutdown()
        await asyncio.to_thread(loop.stop)


SCRATCH_BASE_BYTES = 64 * 2**20
"""llama.cpp's compute buffers for one batch, measured well under this for the default chunk;
the tail adds its logits buffer (see plan_worker_capacity)."""


def plan_worker_capacity(config: WorkerConfig, cache: SliceCache) -> CapacityPlan:
    """Sessions this worker can hold: the configured number, cut to its memory budget."""
    if config.fake is not None or config.model is None:
        return CapacityPlan(config.max_sessions, 0, 0, 0, None)
    description = describe_model(config.model)
    files = cache.shard_files(config.model, config.layers, description.n_layers)
    weights = files.slice.stat().st_size
    scratch = SCRATCH_BASE_BYTES
    if config.layers.is_tail(description.n_layers):
        scratch += 4 * config.prefill_chunk * 65536  # logits rows, generous for vocabularies to 64K
    kv = kv_bytes_per_session(
        config.n_ctx_per_session, len(config.layers), description.n_embd, description.n_head, description.n_head_kv
    )
    budget = None if config.memory_budget_mb is None else int(config.memory_budget_mb * 2**20)
    return plan_capacity(
        requested_sessions=config.max_sessions,
        weight_bytes=weights,
        kv_per_session=kv,
        scratch_bytes=scratch,
        budget_bytes=budget,
    )


def _registration(
    config: WorkerConfig,
    address: str,
    recipe: Recipe,
    model_name: str,
    quantization: str,
    speed: ShardSpeed,
    max_sessions: int,
) -> NodeRegistration:
    return NodeRegistration(
        address=address,
        recipe=recipe,
        fingerprint=recipe.fingerprint(),
        model=model_name,
        quantization=quantization,
        layers=config.layers,
        hardware=HardwareSummary(os.cpu_count() or 1, psutil.virtual_memory().total),
        max_sessions=max_sessions,
        prefill_tokens_per_s=speed.prefill_tokens_per_s,
        decode_tokens_per_s=speed.decode_tokens_per_s,
        certified=True,  # see serve_worker: an uncertified engine never gets this far
    )


def _load(runtime: ShardRuntime) -> NodeLoad:
    metrics = runtime.metrics()
    return NodeLoad(
        active_sessions=int(metrics["active_sessions"]),
        free_sessions=int(metrics["free_sessions"]),
        queue_depth=int(metrics["queue_depth"]),
        kv_used_fraction=metrics["kv_used_fraction"],
        load=min(metrics["queue_depth"] / 8.0, 1.0),
    )


def _epoch_setter(table: SessionTable) -> Callable[[int], None]:
    """New sessions must come with a route of the tracker's current epoch or later; sessions
    already open keep the epoch they were opened with."""

    def set_epoch(epoch: int) -> None:
        table.min_epoch = max(table.min_epoch, epoch)

    return set_epoch


async def _sweep(runtime: ShardRuntime, stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=SWEEP_SECONDS)
        expired = await runtime.expire_idle()
        if expired:
            log.info("expired %d idle session(s)", expired)


async def _drain(runtime: ShardRuntime, health: HealthServicer, grace: float) -> None:
    runtime.draining = True
    await health.enter_graceful_shutdown()
    deadline = asyncio.get_running_loop().time() + grace
    while len(runtime.table) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    if len(runtime.table):
        log.warning("releasing %d session(s) still open after %.0f s of drain", len(runtime.table), grace)


def _install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
