"""``meshnet bench`` end to end: lanes, reference, rounds, probes, context scaling, results.

Returns the results as typed values (``results``); the report and the gate read only the file
they are written to, never the objects of a run.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from contextlib import AsyncExitStack, closing
from dataclasses import replace

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import ModelDescription, decode_work, describe_model
from meshnet.bench.config import BenchConfig, LaneName, parse_lane
from meshnet.bench.context import CachedRunner, clamp_contexts, measure_context_scaling
from meshnet.bench.environment import environment
from meshnet.bench.extra_lanes import measure_extra_lanes
from meshnet.bench.inprocess import CachedLane, RecomputeLane
from meshnet.bench.lanes import measure_lanes
from meshnet.bench.prefill import ROOM_BEYOND_PROMPT, measure_prefill
from meshnet.bench.remote import MeshnetLane
from meshnet.bench.results import (
    BenchResults,
    ContextScaling,
    ModelInfo,
    Noise,
    RunInfo,
    Workload,
)
from meshnet.bench.runner import (
    LaneSet,
    Progress,
    median_foreign,
)
from meshnet.bench.stats import RunRecord
from meshnet.bench.tickets import LaneTickets
from meshnet.bench.workers import WorkerOptions, WorkerSet, client_security
from meshnet.bench.workload import build_prompts, context_prompts, prefill_prompt
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_local_route
from meshnet.engine.tokenizer import Tokenizer
from meshnet.route.driver import RouteDriver
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire.frames import DEFAULT_MAX_FRAME_BYTES

log = logging.getLogger(__name__)
CONTEXT_SHARE_OF_BUDGET = 0.95


def run_bench(config: BenchConfig, progress: Progress = log.info) -> BenchResults:
    return asyncio.run(_run(config, progress))


async def _run(config: BenchConfig, progress: Progress) -> BenchResults:
    started = time.monotonic()
    cache = SliceCache(config.data_dir / "cache")
    # The GGUF header is parsed once; the tokenizer, the lanes and the record all read it.
    description = describe_model(config.model)
    with closing(Tokenizer(description)) as tokenizer:
        model = model_info(description, cache, tokenizer.context_length)
        prompts = build_prompts(tokenizer, max(config.concurrency), config.prompt_tokens)
        long_prompt = prefill_prompt(tokenizer, config.prefill_prompt_tokens, ROOM_BEYOND_PROMPT)
    lane_set = LaneSet(config, cache, description, progress)
    lanes, rounds, noise = await measure_lanes(lane_set, prompts, started)
    prefill = await measure_prefill(config, cache, description, long_prompt, progress) if long_prompt else None
    context = await context_phase(config, cache, description, model, started, progress) if config.contexts else None
    extra = await measure_extra_lanes(config, progress)
    notes = [] if rounds >= config.repetitions else [f"time budget: {rounds} of {config.repetitions} rounds completed"]
    notes += lane_set.notes
    notes += [config.note] if config.note else []
    run = RunInfo(
        timestamp=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        command=config.command,
        quick=config.quick,
        duration_s=time.monotonic() - started,
        time_budget_s=config.time_budget_s,
        rounds_completed=rounds,
        notes=tuple(notes),
    )
    return BenchResults(
        run=run,
        model=model,
        environment=environment(),
        workload=workload_of(config, len(prompts)),
        lanes=lanes,
        context_scaling=context,
        noise=Noise(tuple(noise), median_foreign(noise)),
        extra_lanes=extra,
        prefill=prefill,
    )


def workload_of(config: BenchConfig, prompts: int) -> Workload:
    return Workload(
        lanes=config.lanes,
        prompts=prompts,
        prompt_tokens=config.prompt_tokens,
        output_tokens=config.output_tokens,
        recompute_output_tokens=config.recompute_output_tokens,
        threads=config.threads,
        concurrency=config.concurrency,
        repetitions=config.repetitions,
        max_slots=config.max_slots,
        n_ctx_per_slot=config.n_ctx_per_slot,
        prefill_chunk=config.prefill_chunk,
        sweep_lanes=config.sweep_lanes,
        lane_concurrency=config.lane_concurrency,
        top_concurrency_lanes=config.top_concurrency_lanes,
        contexts=config.contexts,
        context_lane=config.context_lane,
    )


def model_info(description: ModelDescription, cache: SliceCache, model_context: int) -> ModelInfo:
    return ModelInfo(
        path=str(description.path),
        name=description.name,
        sha256=cache.source_sha256(description.path),
        bytes=description.path.stat().st_size,
        n_layers=description.n_layers,
        n_embd=description.n_embd,
        context_length=model_context,
    )


async def context_phase(
    config: BenchConfig,
    cache: SliceCache,
    description: ModelDescription,
    model: ModelInfo,
    started: float,
    progress: Progress,
) -> ContextScaling:
    """Fresh one-session engines with room for the longest context: cached lane vs recompute."""
    fast = parse_lane(config.context_lane, config.recompute_shards)
    longest = max(config.contexts) + config.context_decode_tokens + 2
    limit = model.context_length
    room = min(limit if longest > config.n_ctx_per_slot else config.n_ctx_per_slot, limit)
    contexts = clamp_contexts(config.contexts, room, config.context_decode_tokens)
    llama = config.llama_config(max_slots=1, n_ctx_per_slot=room)
    with closing(Tokenizer(description)) as tokenizer:
        prompts = context_prompts(tokenizer, contexts)
    deadline = started + CONTEXT_SHARE_OF_BUDGET * config.time_budget_s
    async with AsyncExitStack() as stack:
        recompute = RecomputeLane(open_local_route(description, config.recompute_shards, cache, llama))
        stack.callback(recompute.route.close)
        if fast.kind == "meshnet":
            # A long context's prefill may take minutes: the phase's deadline bounds it, not a request timeout.
            timeout = max(config.request_timeout_s, deadline - time.monotonic())
            cached = await _context_route(stack, config, fast, room, timeout)
        else:
            cached = _context_split(stack, open_local_route(description, fast.shards, cache, llama))
        progress(f"context scaling: {fast} vs recompute at {contexts}")
        result = await measure_context_scaling(
            prompts,
            cached,
            recompute,
            fast_lane=str(fast),
            decode_tokens=config.context_decode_tokens,
            deadline=deadline,
            max_recompute_step_s=config.recompute_max_step_s,
        )
    note = (
        f"one session per engine with {room} positions; recompute = {config.recompute_shards} "
        "in-process shards re-running the whole context for each token"
    )
    return replace(result, note=note)


async def _context_route(
    stack: AsyncExitStack, config: BenchConfig, lane: LaneName, room: int, timeout_s: float
) -> CachedRunner:
    """The context phase's cached lane as worker processes: one session each, ``room`` positions."""
    security = client_security(config.data_dir)
    pool = ChannelPool(DEFAULT_MAX_FRAME_BYTES, security)
    stack.push_async_callback(pool.close)
    options = WorkerOptions(config.model, config.data_dir, config.threads, 1, room, config.prefill_chunk)
    ranges = decode_work(config.model).split(lane.shards)  # one stream, unpinned: each process its own share
    workers = WorkerSet(f"context-{lane}", ranges, options, config.worker_start_timeout_s)
    stack.callback(workers.stop)
    driver = RouteDriver(pool, max_frame_bytes=DEFAULT_MAX_FRAME_BYTES)
    remote = MeshnetLane(workers, pool, driver, timeout_s=timeout_s, tickets=LaneTickets(config.data_dir, security))

    async def cached(prompt: tuple[int, ...], n: int) -> RunRecord:
        return await remote.run((prompt,), [0], n)

    return cached


def _context_split(stack: AsyncExitStack, route: LocalRoute) -> CachedRunner:
    """The context phase's cached lane as an in-process split."""
    stack.callback(route.close)
    engine = CachedLane(route)

    async def cached(prompt: tuple[int, ...], n: int) -> RunRecord:
        return engine.run((prompt,), [0], n).record

    return cached
