"""``meshnet bench`` end to end: lanes, reference, rounds, probes, context scaling, results file.

Returns the results as a plain dict (the shape ``results.schema.json`` describes) and writes it;
the report and the gate read only that file, never the objects of a run.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time

import numpy as np

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import ModelDescription, describe_model
from meshnet.bench.config import REFERENCE_LANE, BenchConfig, parse_lane
from meshnet.bench.context import clamp_contexts, measure_context_scaling
from meshnet.bench.environment import hardware, runtime_versions
from meshnet.bench.hops import probe_hops
from meshnet.bench.inprocess import CachedLane, RecomputeLane
from meshnet.bench.remote import MeshnetLane
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
from meshnet.bench.workers import WorkerOptions, WorkerSet
from meshnet.bench.workload import build_prompts, tokens_of_length
from meshnet.client.route_driver import RouteDriver
from meshnet.client.shard_stream import ChannelPool
from meshnet.core.errors import MeshnetError
from meshnet.core.layers import split_evenly
from meshnet.engine.shards import open_local_route
from meshnet.engine.tokenizer import Tokenizer
from meshnet.protocol.frames import DEFAULT_MAX_FRAME_BYTES

log = logging.getLogger(__name__)
PROBE_TOKENS = 32
CONTEXT_SHARE_OF_BUDGET = 0.95


def run_bench(config: BenchConfig, progress: Progress = log.info) -> dict[str, object]:
    return asyncio.run(_run(config, progress))


async def _run(config: BenchConfig, progress: Progress) -> dict[str, object]:
    started = time.monotonic()
    cache = SliceCache(config.data_dir / "cache")
    model = describe_model(config.model)
    model_info = model_record(model, cache)
    prompts = build_prompts(model, max(config.concurrency), config.prompt_tokens)
    lanes = LaneSet(config, cache, model, progress)
    notes = list(config.extra_notes)
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
        lane_results = {lane.label: lane_result(lane, reference, tokens) for lane in lanes.lanes}
    finally:
        await lanes.close()
    context = None
    if config.contexts:
        context = await context_phase(config, cache, model, started, progress)
    if rounds < config.repetitions:
        notes.append(f"time budget: {rounds} of {config.repetitions} rounds completed")
    return {
        "schema": "meshnet-bench-results",
        "schema_version": 1,
        "run": {
            "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": config.command,
            "quick": config.quick,
            "duration_s": time.monotonic() - started,
            "time_budget_s": config.time_budget_s,
            "rounds_completed": rounds,
            "notes": notes,
        },
        "model": model_info,
        "environment": {"runtime": runtime_versions(), "hardware": hardware()},
        "workload": {
            "lanes": list(config.lanes),
            "prompts": len(prompts),
            "prompt_tokens": config.prompt_tokens,
            "output_tokens": config.output_tokens,
            "recompute_output_tokens": config.recompute_output_tokens,
            "sampling": "greedy",
            "threads": config.threads,
            "concurrency": list(config.concurrency),
            "repetitions": config.repetitions,
            "max_slots": config.max_slots,
            "n_ctx_per_slot": config.n_ctx_per_slot,
            "prefill_chunk": config.prefill_chunk,
            "interleaved": True,
            "sweep_lanes": list(config.sweep_lanes),
            "lane_concurrency": list(config.lane_concurrency),
            "contexts": list(config.contexts),
            "context_lane": config.context_lane,
        },
        "lanes": lane_results,
        "context_scaling": context,
        "noise": {"rounds": noise, "foreign_cores_median": median_foreign(noise)},
    }


def model_record(model: ModelDescription, cache: SliceCache) -> dict[str, object]:
    return {
        "path": str(model.path),
        "name": model.name,
        "sha256": cache.source_sha256(model.path),
        "bytes": model.path.stat().st_size,
        "n_layers": model.n_layers,
        "n_embd": model.n_embd,
        "context_length": model.context_length,
    }


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
            lane.hop_timing = await probe_hops(
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
    config: BenchConfig, cache: SliceCache, model: ModelDescription, started: float, progress: Progress
) -> dict[str, object]:
    """Fresh one-session engines with room for the longest context: cached lane vs recompute."""
    fast = parse_lane(config.context_lane, config.recompute_shards)
    longest = max(config.contexts) + config.context_decode_tokens + 2
    model_context = model.context_length
    room = min(model_context if longest > config.n_ctx_per_slot else config.n_ctx_per_slot, model_context)
    contexts = clamp_contexts(config.contexts, room, config.context_decode_tokens)
    llama = config.llama_config(max_slots=1, n_ctx_per_slot=room)
    tokenizer = Tokenizer(model)
    try:
        prompts = {c: tokens_of_length(tokenizer, "Read this long document and continue it.", c) for c in contexts}
    finally:
        tokenizer.close()
    deadline = started + CONTEXT_SHARE_OF_BUDGET * config.time_budget_s
    recompute = RecomputeLane(open_local_route(model, config.recompute_shards, cache, llama))
    pool = ChannelPool(DEFAULT_MAX_FRAME_BYTES)
    workers: WorkerSet | None = None
    local: CachedLane | None = None
    try:
        if fast.kind == "meshnet":
            n_layers = model.n_layers
            options = WorkerOptions(config.model, config.data_dir, config.threads, 1, room, config.prefill_chunk)
            workers = WorkerSet(
                f"context-{fast}", split_evenly(n_layers, fast.shards), options, config.worker_start_timeout_s
            )
            driver = RouteDriver(pool, max_frame_bytes=DEFAULT_MAX_FRAME_BYTES)
            # A long context's prefill may take minutes: the phase's deadline bounds it, not a request timeout.
            timeout = max(config.request_timeout_s, deadline - time.monotonic())
            remote = MeshnetLane(str(fast), workers, pool, driver, timeout_s=timeout)

            async def cached(prompt: tuple[int, ...], n: int) -> RunRecord:
                return await remote.run((prompt,), [0], n)
        else:
            engine = local = CachedLane(str(fast), open_local_route(model, fast.shards, cache, llama))

            async def cached(prompt: tuple[int, ...], n: int) -> RunRecord:
                return engine.run((prompt,), [0], n).record

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
        result["note"] = (
            f"one session per engine with {room} positions; recompute = {config.recompute_shards} "
            "in-process shards re-running the whole context for each token"
        )
        return result
    finally:
        recompute.route.close()
        if local is not None:
            local.route.close()
        if workers is not None:
            workers.stop()
        await pool.close()
