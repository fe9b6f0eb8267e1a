"""Build one worker from its config, once: capacity, certification, engine, record, socket, shard.

Order, and why: plan capacity (refuse at once if not one session fits the memory budget),
certify the engine (an engine that fails never opens: the worker never listens), start the
engine loop, measure speed, bind the port (exclusively), write the node's record (what it
registers, what its shard enforces and GetCapability shows), then build the shard for the role
the loaded backend has. Nothing is started that serves requests: ``server.serve_worker`` does that.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, replace
from functools import partial

import grpc
import grpc.aio
import psutil
from grpc_health.v1 import health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import ModelDescription, describe_model
from meshnet.artifact.directory import Advertisement
from meshnet.artifact.footprint import memory_footprint
from meshnet.artifact.model_id import served_model_id
from meshnet.core.addresses import dialable_address, is_unspecified_host
from meshnet.core.devices import CPU, DeviceDrift, DeviceInfo, placement_budget
from meshnet.core.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from meshnet.core.layer_costs import kv_bytes_per_layer, sessions_within, worker_bytes
from meshnet.core.limits import served_context
from meshnet.core.node_record import HardwareSummary, NodeCapability, NodeRecord
from meshnet.core.recipe import Recipe
from meshnet.engine.backend import Backend, ShardShape
from meshnet.engine.certification import CertificationReport, certify_fake_engine, certify_llama_engine
from meshnet.engine.constraints import GrammarVocabulary
from meshnet.engine.device_drift import measure_device_drift
from meshnet.engine.devices import find_device, loaded_device
from meshnet.engine.fake_backend import FAKE_BACKEND_VERSION, FakeBackend
from meshnet.engine.llama_ffi import LLAMA_CPP_PYTHON_VERSION
from meshnet.engine.shards import open_llama_shard
from meshnet.membership.join import own_node_id
from meshnet.moe.config import ExpertFrontConfig
from meshnet.moe.front import ExpertGroupBackend, group_capacity, open_group_backend
from meshnet.moe.ownership import ExpertNumerics
from meshnet.node.artifact_server import fetch_worker_range, serve_fetched_artifacts
from meshnet.node.calibrate import ShardSpeed, measure_speed
from meshnet.node.config import FakeModel, WorkerConfig
from meshnet.node.servicer import ShardServicer
from meshnet.node.shard import AnyShard
from meshnet.node.shard_wiring import WorkerLinks, snapshot_settings, worker_shard
from meshnet.session.admission import CapacityPlan
from meshnet.session.engine_loop import EngineLoop
from meshnet.wire import services
from meshnet.wire.tls import LinkSecurity, bind, link_options


@dataclass(frozen=True)
class AssembledWorker:
    """Everything ``serve_worker`` starts, serves with and stops."""

    config: WorkerConfig
    loop: EngineLoop
    shard: AnyShard
    server: grpc.aio.Server
    health: HealthServicer
    links: WorkerLinks
    """What the worker sends to its peers over: session streams, ring batches, their count."""
    registration: NodeRecord
    """The node's record: what it registers with the tracker, and what its shard enforces."""
    held_artifacts: Advertisement | None = None
    """What this worker fetched by model id and serves to peers (announced by ``serve_worker``)."""
    security: LinkSecurity | None = None
    """The worker's swarm identity; None only on loopback with ``--insecure``."""
    expert_group: ExpertGroupBackend | None = None
    """The group this worker fronts (``--expert-group``); None for a worker with its own slice."""
    listen_address: str = ""
    """``host:port`` this machine reaches its own server at (loopback for a wildcard bind): where
    a relay attachment splices dialers in (``meshnet.relay.attach``)."""


@dataclass(frozen=True)
class ModelIdentity:
    recipe: Recipe
    model_name: str
    quantization: str


async def assemble_worker(config: WorkerConfig, security: LinkSecurity | None = None) -> AssembledWorker:
    """The worker ``config`` describes, its engine running and its port bound, not yet serving."""
    fetched = None
    if config.model_id is not None and config.fake is None:
        fetched = await fetch_worker_range(config, security)
        # The header-only copy describes the model; the fetched slice is already in the cache.
        # Served under the published name, not the header copy's file name.
        config = replace(config, model=fetched.header, model_name=config.model_name or fetched.manifest.model_id)
    cache = SliceCache(config.data_dir / "cache")
    # Parsed once: capacity planning, the engine and the recipe all read this one description.
    description = None if config.fake or config.model is None else await asyncio.to_thread(describe_model, config.model)
    # Resolved once: capacity, certification, the engine and the recipe all name this one device.
    device = CPU if description is None else await asyncio.to_thread(find_device, config.device)
    capacity = await asyncio.to_thread(plan_worker_capacity, config, description, device)
    # Raises CertificationFailed before any engine opens: a worker that serves is certified.
    certification = await asyncio.to_thread(certify_engine, config, description, device)
    # A GPU's drift from the CPU: the evidence a mixed-device route needs (the tracker's opt-in).
    drift = await asyncio.to_thread(measure_device_drift, device, repack=config.repack) if device.is_gpu else None
    # A group front's backend waits on its nodes inside ``run``: its steps must not block the loop.
    inline = config.fake is None and not config.expert_group
    loop = EngineLoop(
        partial(open_backend, config, cache, description, capacity.max_sessions, security, device),
        inline_decode=inline,
    )
    await asyncio.to_thread(loop.start)
    group = loop.backend if isinstance(loop.backend, ExpertGroupBackend) else None
    if group is not None:
        capacity = group_capacity(group.shape)  # the group's sessions, known once it is reached
    try:
        speed = await loop.call(measure_speed)
        model = model_identity(config, cache, description, device)
        server, port = _bind(config, security)
        # A wildcard bind registers the address of the interface that routes to the tracker.
        address = config.advertise or dialable_address(f"{config.host}:{port}", toward=config.tracker)
        # The node's one id (``NodeId``): registration, routes, hop pinning and work records.
        node_id = own_node_id(security)
        device = await asyncio.to_thread(loaded_device, device)  # its memory with the engine in
        measured = (speed, capacity.prefix_cache_bytes)
        record = _registration(config, address, model, loop.backend.shape, measured, certification, (device, drift))
        links = WorkerLinks.open(config.max_frame_bytes, security)
        grammars = await asyncio.to_thread(tail_grammars, config, description)
        snapshots = await snapshot_settings(config, node_id, links, record)
        shard = worker_shard(config, (node_id, record), loop, capacity, links, security, grammars, snapshots)
    except BaseException:
        await asyncio.to_thread(loop.stop)
        raise
    health = HealthServicer()
    services.add_shard_servicer(ShardServicer(shard, security), server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    held = None
    if fetched is not None:
        held = serve_fetched_artifacts(fetched, config.layers, address, node_id, server, security)
    own = "127.0.0.1" if is_unspecified_host(config.host) else config.host.strip("[]")
    local = f"[{own}]:{port}" if ":" in own else f"{own}:{port}"
    return AssembledWorker(config, loop, shard, server, health, links, record, held, security, group, local)


def tail_grammars(config: WorkerConfig, description: ModelDescription | None) -> GrammarVocabulary | None:
    """The vocabulary a tail constrains output with (response_format); None off the tail or
    without a real model with a tokenizer (such a tail refuses grammar sessions)."""
    if description is None or not description.has_tokenizer or config.layers.stop != description.n_layers:
        return None
    return GrammarVocabulary(description.path)


def certify_engine(
    config: WorkerConfig, description: ModelDescription | None, device: DeviceInfo = CPU
) -> CertificationReport:
    """Certify the engine this worker runs: the family and weight types of its model on this
    build, or its fake engine. Raises ``CertificationFailed``, and the worker never listens.

    A group's front computes nothing itself (its nodes certified the expert split at start-up,
    ``moe.certification``), but it registers the recipe as any full worker does, so it presents
    that recipe's certification, run on its own build."""
    if config.fake is not None:
        return certify_fake_engine(config.fake.n_layers, config.fake.n_embd, config.fake.n_vocab)
    if description is None:
        raise InvalidArgument("a worker needs --model (or a fake model)")
    return certify_llama_engine(model=description.path, repack=config.repack, device=device, kv_type=config.kv_type)


def _registration(
    config: WorkerConfig,
    address: str,
    model: ModelIdentity,
    shape: ShardShape,
    measured: tuple[ShardSpeed, int],
    certification: CertificationReport,
    on: tuple[DeviceInfo, DeviceDrift | None],
) -> NodeRecord:
    """The node's record, from what the running engine is (its shape), measured (its speed, the
    prompt KV it keeps) and certified, ``on`` its device (with its drift from the CPU, for a GPU)."""
    device, drift = on
    speed, prefix_cache_bytes = measured
    capability = NodeCapability(
        n_ctx_per_session=shape.n_ctx_per_slot,
        prefill_chunk_tokens=shape.max_batch_tokens,
        max_tokens_per_frame=shape.n_ctx_per_slot,
        max_frame_bytes=config.max_frame_bytes,
        n_embd=shape.n_embd,
        max_sessions=shape.max_slots,
        device=device.kind,
        prefill_tokens_per_s=speed.prefill_tokens_per_s,
        decode_tokens_per_s=speed.decode_tokens_per_s,
        device_name=device.description if device.is_gpu else "",
        device_memory_total=device.memory_total,
        device_memory_free=min(device.memory_free, device.memory_total),
        drift=drift,
        prefix_cache_bytes=prefix_cache_bytes,
    )
    fingerprint = model.recipe.fingerprint()
    return NodeRecord(
        address=address,
        recipe=model.recipe,
        fingerprint=fingerprint,
        model=model.model_name,
        quantization=model.quantization,
        layers=config.layers,
        hardware=HardwareSummary(os.cpu_count() or 1, psutil.virtual_memory().total),
        capability=capability,
        certification=certification.bound_to(fingerprint),
        expert_group=config.expert_group,
    )


def _bind(config: WorkerConfig, security: LinkSecurity | None) -> tuple[grpc.aio.Server, int]:
    # gRPC sets SO_REUSEPORT by default: a second worker on a busy port would then bind beside
    # the first, print ready and get half of its traffic. Exclusive ports make it fail here.
    server = grpc.aio.server(options=[*link_options(config.max_frame_bytes), ("grpc.so_reuseport", 0)])
    target = f"{config.host}:{config.port}"
    try:
        return server, bind(server, target, security)
    except RuntimeError as error:
        # Not Unavailable: that code says a peer was lost, and nothing was lost, the port is taken.
        raise FailedPrecondition(f"the worker cannot listen on {target} (is the port in use?): {error}") from error


def open_backend(
    config: WorkerConfig,
    cache: SliceCache,
    description: ModelDescription | None,
    max_sessions: int,
    security: LinkSecurity | None = None,
    device: DeviceInfo = CPU,
) -> Backend:
    """The engine for ``config``'s layers; runs on the engine loop's own thread."""
    if config.fake is not None:
        fake = config.fake
        return FakeBackend(
            config.layers,
            fake.n_layers,
            n_embd=fake.n_embd,
            n_vocab=fake.n_vocab,
            max_slots=max_sessions,
            n_ctx_per_slot=config.n_ctx_per_session,
            max_batch_tokens=config.prefill_chunk,
            step_delay=fake.step_delay,
        )
    # certify_engine ran first (assemble_worker): an engine that failed never gets here.
    if description is None:
        raise InvalidArgument("a worker needs --model (or a fake model)")
    if config.expert_group:  # the group's nodes certified themselves; this process loads no weights
        front = expert_front_config(config)
        return open_group_backend(front, description, cache.source_sha256(description.path), security)
    return open_llama_shard(description, config.layers, cache, config.llama_config(max_sessions, device))


def expert_front_config(config: WorkerConfig) -> ExpertFrontConfig:
    """What a front of an expert-parallel group (``--expert-group``) takes of the worker's flags."""
    return ExpertFrontConfig(
        config.expert_group, config.layers, ExpertNumerics(config.prefill_chunk, config.flash_attn, config.repack)
    )


def backend_label(config: WorkerConfig) -> str:
    # Settings that change llama.cpp's arithmetic are part of the recipe identity.
    label = f"llama.cpp(flash_attn={'on' if config.flash_attn else 'off'},prefill_chunk={config.prefill_chunk}"
    # Named only when they differ from the CPU default, so a CPU recipe's fingerprint stays what it was.
    return label + ("" if config.repack else ",repack=off") + ")"


def device_class(config: WorkerConfig, device: DeviceInfo) -> str:
    """The recipe's device part: the device model, and how much of the range it runs."""
    if not device.is_gpu:
        return ""
    return f"{device.numerics_class} gpu_layers={'all' if config.gpu_layers is None else config.gpu_layers}"


def model_identity(
    config: WorkerConfig, cache: SliceCache, description: ModelDescription | None, device: DeviceInfo = CPU
) -> ModelIdentity:
    """The recipe this worker serves and the names it registers under."""
    if description is None:
        return ModelIdentity(fake_recipe(config.fake or FakeModel()), config.model_name or "fake", "none")
    recipe = Recipe(
        model_sha256=cache.source_sha256(description.path),
        architecture=description.architecture,
        adapter_version=description.adapter_version,
        weight_quantization=description.quantization,
        activation_dtype="f32",
        kv_dtype=str(config.kv_type),
        backend=backend_label(config),
        backend_version=LLAMA_CPP_PYTHON_VERSION,
        n_layers=description.n_layers,
        n_embd=description.n_embd,
        device_class=device_class(config, device),
    )
    return ModelIdentity(recipe, served_model_id(description.path, config.model_name), description.quantization)


def fake_recipe(fake: FakeModel) -> Recipe:
    return Recipe(
        model_sha256="fake",
        architecture="fake",
        adapter_version="1",
        weight_quantization="none",
        activation_dtype="f32",
        kv_dtype="none",
        backend="fake",
        backend_version=FAKE_BACKEND_VERSION,
        n_layers=fake.n_layers,
        n_embd=fake.n_embd,
    )


def plan_worker_capacity(
    config: WorkerConfig, description: ModelDescription | None, device: DeviceInfo = CPU
) -> CapacityPlan:
    """Sessions this worker can hold: the configured number, cut to its memory budget by the one
    memory cost model (``core.layer_costs``, the one ``--layers auto`` and the tracker use); on a
    GPU that takes every layer, cut to its device memory too (``core.devices.placement_budget``).

    Refuses (ResourceExhausted) when not even one session fits: a shard that cannot hold a
    session must not register as if it could.
    """
    if description is not None:  # never past what the model was trained for, nor 128K
        served_context(description.context_length, config.n_ctx_per_session)
    if description is None or config.expert_group:  # a group's capacity is its nodes' (group_capacity)
        return CapacityPlan(config.max_sessions, 0, 0, 0, None, config.prefix_cache_bytes)
    footprint = memory_footprint(description.path)
    load, layers = config.memory_load(), config.layers
    budget = placement_budget(config.memory_budget_bytes(), device, config.gpu_layers)
    sessions = load.sessions if budget is None else sessions_within(footprint, layers, load, budget)
    planned = replace(load, sessions=max(sessions, 1))
    weights = sum(footprint.block_bytes[layers.start : layers.stop])
    kv = kv_bytes_per_layer(footprint, load.context, load.kv_type) * len(layers)
    other = worker_bytes(footprint, layers, planned) - weights - kv * planned.sessions
    if budget is not None and sessions < 1:
        raise ResourceExhausted(
            f"memory budget {budget / 2**20:.0f} MiB cannot hold layers {layers}: their weights "
            f"({weights / 2**20:.0f} MiB), the runtime, scratch and what the range carries besides "
            f"({other / 2**20:.0f} MiB) and one session's KV ({kv / 2**20:.1f} MiB)"
        )
    # The sessions come first; the reuse store gets what the budget has left, up to its own.
    left = None if budget is None else budget - (weights + other + kv * planned.sessions)
    store = config.prefix_cache_bytes if left is None else max(0, min(config.prefix_cache_bytes, left))
    return CapacityPlan(sessions, weights, kv, other, budget, store)
