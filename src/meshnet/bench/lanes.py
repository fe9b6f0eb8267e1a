"""Measuring a set of lanes on one workload: warm-up, the reference tokens, interleaved rounds,
hop probes and worker memory. The suite runs it on the main model, the extra lanes on theirs."""

from __future__ import annotations

import numpy as np

from meshnet.bench.config import REFERENCE_LANE
from meshnet.bench.hops import probe_hops
from meshnet.bench.inprocess import CachedLane
from meshnet.bench.remote import MeshnetLane
from meshnet.bench.results import CpuSample, LaneResult
from meshnet.bench.runner import WARMUP_TOKENS, LaneSet, LaneState, lane_result, reference_lane, run_rounds
from meshnet.core.errors import MeshnetError
from meshnet.wire.frames import DEFAULT_MAX_FRAME_BYTES

PROBE_TOKENS = 32
"""Decode steps each hop probe times (`bench.hops`)."""


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
        try:
            session = await engine.session()
            lane.probe = await probe_hops(
                lanes.pool,
                session,
                np.asarray(prompt, np.int32),
                PROBE_TOKENS,
                max_frame_bytes=DEFAULT_MAX_FRAME_BYTES,
                n_embd=session.hops[0].capability.n_embd,
            )
        except MeshnetError as error:
            lanes.progress(f"{lane.label}: hop probe failed: {error.code}: {error.message}")
        await engine.wait_idle()
