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

import numpy as np

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import ModelDescription, decode_work, describe_model
from meshnet.bench.config import REFERENCE_LANE, BenchConfig, LaneName, parse_lane
from meshnet.bench.context import CachedRunner, clamp_contexts, measure_context_scaling
from meshnet.bench.environment import environment
from meshnet.bench.extra_lanes import measure_extra_lanes
from meshnet.bench.hops import probe_hops
from meshnet.bench.inprocess import CachedLane, RecomputeLane
from meshnet.bench.prefill import ROOM_BEYOND_PROMPT, measure_prefill
from meshnet.bench.remote import MeshnetLane
from meshnet.bench.results import (
    BenchResults,
    ContextScaling,
    CpuSample,
    LaneResult,
    ModelInfo,
    Noise,
    RunInfo,
    Workload,
)
from meshnet.bench.runner import (
    WARMUP_TOKENS,
    LaneSet,
    LaneState,
    Progress,
    lane_result,
    median_foreign,
    reference_lane,
    run_rounds,
)
from meshnet.bench.stats import RunRecord
from meshnet.bench.workers import WorkerOptions, WorkerSet, client_security
from meshnet.bench.workload import build_prompts, context_prompts, prefill_prompt
from meshnet.client.route_driver import RouteDriver
from meshnet.client.shard_stream import ChannelPool
from meshnet.core.errors import MeshnetError
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_local_route
from meshnet.engine.tokenizer import Tokenizer
from meshnet.protocol.frames import DEFAULT_MAX_FRAME_BYTES

log = logging.getLogger(__name__)
PROBE_TOKENS = 32
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


async def measure_lanes(
    lanes: LaneSet, prompts: tuple[tuple[int, ...], ...], started: float
) -> tuple[dict[str, LaneResult], int, list[CpuSample]]:
    """Every lane: warm-up, reference tokens, interleaved rounds, hop probes, worker memory."""
    try:
        lanes.open()
        await warm_up(lanes, prompts)
        reference = reference_lane(lanes)
        tokens = await reference_pass(lanes, reference, prompts)
        rounds, noise = await run_rounds(lanes, prompts, started)
        await probe_routes(lanes, prompts[0])
        for lane in lanes.lanes:
            if lane.workers is not None:
                lane.rss = lane.workers.rss()
        return {lane.label: lane_result(lane, reference, tokens) for lane in lanes.lanes}, rounds, noise
    finally:
        await lanes.close()


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


async def warm_up(lanes: LaneSet, prompts: tuple[tuple[int, ...], ...]) -> None:
    """One short run per lane: first calls pay for page faults, thread start-up and connections."""
    for lane in lanes.measurable():
        try:
            await lanes.run(lane, prompts[:1], WARMUP_TOKENS)
        except MeshnetError as error:
            lane.fail(f"warm-up failed: {error.code}: {error.message}")
            lanes.progress(f"{lane.label}: {lane.reason}")


async def reference_pass(
    lanes: LaneSet, reference: LaneState | None, prompts: tuple[tuple[int, ...], ...]
) -> dict[int, tuple[int, ...]]:
    """The reference tokens of every prompt (solo, greedy) and slot-0 logits of each in-process lane."""
    tokens: dict[int, tuple[int, ...]] = {}
    if reference is None or reference.engine is None:
        return tokens
    for index, prompt in enumerate(prompts):
        record = await lanes.run(
            reference, (prompt,), lanes.config.output_tokens, indices=[index], keep_logits=index == 0
        )
        trace = record.requests[0]
        if trace.error is None:
            tokens[index] = trace.tokens
    for lane in lanes.measurable():
        if isinstance(lane.engine, CachedLane) and lane is not reference:
            await lanes.run(lane, prompts[:1], lanes.config.output_tokens, keep_logits=True)
    lanes.progress(f"reference tokens from {REFERENCE_LANE} for {len(tokens)} prompt(s)")
    return tokens


async def probe_routes(lanes: LaneSet, prompt: tuple[int, ...]) -> None:
    for lane in lanes.measurable():
        engine = lane.engine
        if not isinstance(engine, MeshnetLane):
            continue
        capability = await engine.driver.capability(engine.workers.hops[0].address)
        try:
            lane.probe = await probe_hops(
                lanes.pool,
                engine.session(),
                np.asarray(prompt, np.int32),
                PROBE_TOKENS,
                max_frame_bytes=DEFAULT_MAX_FRAME_BYTES,
                n_embd=capability.n_embd,
            )
        except MeshnetError as error:
            lanes.progress(f"{lane.label}: hop probe failed: {error.code}: {error.message}")
        await engine.wait_idle()


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
    pool = ChannelPool(DEFAULT_MAX_FRAME_BYTES, client_security(config.data_dir))
    stack.push_async_callback(pool.close)
    options = WorkerOptions(config.model, config.data_dir, config.threads, 1, room, config.prefill_chunk)
    ranges = decode_work(config.model).split(lane.shards)  # one stream, unpinned: each process its own share
    workers = WorkerSet(f"context-{lane}", ranges, options, config.worker_start_timeout_s)
    stack.callback(workers.stop)
    remote = MeshnetLane(workers, pool, RouteDriver(pool, max_frame_bytes=DEFAULT_MAX_FRAME_BYTES), timeout_s=timeout_s)

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
