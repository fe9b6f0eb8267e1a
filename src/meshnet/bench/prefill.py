"""The prefill phase: TTFT of one long prompt, a pinned worker route vs whole-model llama.cpp.

Issue 15's pipelined prefill: while shard k runs chunk c, shard k-1 already runs chunk c+1, so a
route of N workers, each pinned to its own core, should see a long prompt's first token after
about 1/N of whole-model's one-core prefill plus a chunk. Whole-model with 2 threads is the
other way to put two cores to work, so it is measured beside it.

Every subject gets fresh engines with one session and room for the prompt (the sweep's KV
geometry has no room for 2,048 tokens plus output), opened through the lanes machinery
(``runner.LaneSet``). Rounds visit the subjects in rotated order, as the sweep does, and a
further round starts only while the phase's budget still has room for one like the last.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import ModelDescription
from meshnet.bench.config import BenchConfig
from meshnet.bench.environment import CpuMeter
from meshnet.bench.remote import MeshnetLane
from meshnet.bench.results import PrefillLane, PrefillPhase
from meshnet.bench.runner import LaneSet, LaneState, Progress
from meshnet.bench.stats import median, paired_ratio
from meshnet.core.errors import MeshnetError

WHOLE_1 = "llama-whole-1-thread"
"""The reference every TTFT ratio is taken against."""
WHOLE_2 = "llama-whole-2-threads"
OUTPUT_TOKENS = 1
"""Only the first token is timed."""
ROOM_BEYOND_PROMPT = 8
"""KV positions past the prompt: the first token and a margin."""
WARMUP_PROMPT_TOKENS = 16


def route_key(lane: str) -> str:
    return f"{lane}-pinned"


def first_tokens_agree(tokens: Sequence[Sequence[int]]) -> bool | None:
    """Whether every subject's every first token is one and the same; None below two subjects."""
    measured = [t for t in tokens if t]
    if len(measured) < 2:
        return None
    return len({token for subject in measured for token in subject}) == 1


def another_round_fits(elapsed_s: float, last_round_s: float, budget_s: float, completed: int, wanted: int) -> bool:
    """The first round always runs; each further one only when one like the last still fits."""
    return completed == 0 or (completed < wanted and elapsed_s + last_round_s <= budget_s)


def shard_busy(before: Sequence[dict[str, float]], after: Sequence[dict[str, float]]) -> list[float]:
    """Seconds each shard's engine spent inside llama.cpp between two metric snapshots."""
    key = "engine_busy_seconds_total"
    return [max(new.get(key, 0.0) - old.get(key, 0.0), 0.0) for old, new in zip(before, after, strict=True)]


@dataclass
class _Subject:
    """One way of running the prompt while the phase runs: its lane and what each round measured."""

    key: str
    state: LaneState
    lanes: LaneSet
    threads: int
    pinning: str
    ttft_s: list[float | None] = field(default_factory=list)
    first_tokens: list[int] = field(default_factory=list)
    busy_s: list[list[float]] = field(default_factory=list)


def _sub_config(config: BenchConfig, lanes: tuple[str, ...], threads: int, prompt_tokens: int) -> BenchConfig:
    return replace(
        config,
        lanes=lanes,
        threads=threads,
        max_slots=1,
        n_ctx_per_slot=prompt_tokens + ROOM_BEYOND_PROMPT,
        prompt_tokens=prompt_tokens,
        output_tokens=2,
        concurrency=(1,),
        sweep_lanes=lanes,
        lane_concurrency=(1,),
        contexts=(),
        extra_lanes=(),
        pin_workers=True,
    )


def _lane_sets(
    config: BenchConfig, cache: SliceCache, model: ModelDescription, prompt_tokens: int, progress: Progress
) -> list[LaneSet]:
    """Whole-model and the route at 1 thread, whole-model at 2 threads (not opened yet)."""
    route = _sub_config(config, ("llama-whole", config.prefill_lane), 1, prompt_tokens)
    return [
        LaneSet(route, cache, model, progress, prefill=True),
        LaneSet(_sub_config(config, ("llama-whole",), 2, prompt_tokens), cache, model, progress),
    ]


def _subjects(lane_sets: Sequence[LaneSet]) -> list[_Subject]:
    subjects = []
    for lane_set in lane_sets:
        lane_set.open()
        threads = lane_set.config.threads
        for state in lane_set.lanes:
            if state.workers is not None:
                layers = ", ".join(map(str, state.workers.ranges))
                pinning = f"{state.workers.pinning}; layers {layers} (split by prefill work)"
                key = route_key(state.label)
            else:
                key, pinning = WHOLE_1 if threads == 1 else WHOLE_2, "the bench process, not pinned"
            subjects.append(_Subject(key, state, lane_set, threads, pinning))
    return subjects


async def measure_prefill(
    config: BenchConfig, cache: SliceCache, model: ModelDescription, prompt: tuple[int, ...], progress: Progress
) -> PrefillPhase:
    """TTFT of ``prompt`` on the pinned route and on whole-model at 1 and 2 threads."""
    started = time.monotonic()
    lane_sets = _lane_sets(config, cache, model, len(prompt), progress)
    try:
        subjects = _subjects(lane_sets)
        meter = CpuMeter([pid for lane_set in lane_sets for pid in lane_set.worker_pids()])
        for subject in subjects:
            await _timed(subject, prompt[:WARMUP_PROMPT_TOKENS], keep=False)
        rounds, last = 0, 0.0
        while another_round_fits(time.monotonic() - started, last, config.prefill_budget_s, rounds, config.repetitions):
            begun = time.monotonic()
            shift = rounds % len(subjects)
            for subject in subjects[shift:] + subjects[:shift]:
                await _timed(subject, prompt, keep=True)
            rounds, last = rounds + 1, time.monotonic() - begun
            progress(f"prefill round {rounds}: {', '.join(_shown(s) for s in subjects)}")
        foreign = meter.read().foreign_cores
    finally:
        for lane_set in lane_sets:
            await lane_set.close()
    return replace(phase_of(subjects, len(prompt), config, rounds), foreign_cores=foreign)


async def _timed(subject: _Subject, prompt: tuple[int, ...], *, keep: bool) -> None:
    """One run of ``prompt``; with ``keep``, its TTFT, first token and shard busy times are recorded."""
    state = subject.state
    engine = state.engine
    if engine is None:
        if keep:
            subject.ttft_s.append(None)
        return
    try:
        before = await engine.metrics() if isinstance(engine, MeshnetLane) else []
        record = await subject.lanes.run(state, (prompt,), OUTPUT_TOKENS)
        after = await engine.metrics() if isinstance(engine, MeshnetLane) else []
    except MeshnetError as error:
        state.fail(f"prefill run failed: {error.code}: {error.message}")
        record = None
    trace = record.requests[0] if record is not None else None
    if trace is not None and (trace.error is not None or not trace.token_times):
        state.fail(f"prefill run failed: {trace.error or 'no token'}")
        trace = None
    if not keep:
        return
    subject.ttft_s.append(trace.token_times[0] - trace.started if trace is not None else None)
    if trace is not None:
        subject.first_tokens.append(trace.tokens[0])
        if before:
            subject.busy_s.append(shard_busy(before, after))


def _shown(subject: _Subject) -> str:
    last = subject.ttft_s[-1] if subject.ttft_s else None
    return f"{subject.key} {'failed' if last is None else f'{last * 1000:.0f} ms'}"


def phase_of(subjects: Sequence[_Subject], prompt_tokens: int, config: BenchConfig, rounds: int) -> PrefillPhase:
    reference = next((s.ttft_s for s in subjects if s.key == WHOLE_1), [])
    lanes = {s.key: _lane_result(s, reference, prompt_tokens) for s in subjects}
    chunks = -(-prompt_tokens // config.prefill_chunk)
    note = (
        f"one {prompt_tokens}-token prompt ({chunks} prefill chunks of {config.prefill_chunk}), "
        f"first token only, greedy; fresh engines with one session; {rounds} round(s)"
    )
    return PrefillPhase(
        prompt_tokens=prompt_tokens,
        prefill_chunk=config.prefill_chunk,
        rounds=rounds,
        quick=config.quick,
        lanes=lanes,
        first_token_agrees=first_tokens_agree([s.first_tokens for s in subjects]),
        note=note + (" (quick: a shorter prompt than the full run's)" if config.quick else ""),
    )


def _lane_result(subject: _Subject, reference: Sequence[float | None], prompt_tokens: int) -> PrefillLane:
    measured = [t for t in subject.ttft_s if t is not None]
    ttft_s = median(measured)
    per_shard = list(zip(*subject.busy_s, strict=True)) if subject.busy_s else []
    busy = [median(list(shard)) or 0.0 for shard in per_shard]
    state = subject.state
    return PrefillLane(
        lane=state.label,
        threads=subject.threads,
        processes=state.name.shards if state.workers is not None else 1,
        pinning=subject.pinning,
        status=state.status,
        reason=state.reason,
        ttft_ms=None if ttft_s is None else ttft_s * 1000.0,
        ttft_ms_rounds=tuple(t * 1000.0 for t in measured),
        prefill_tok_s=prompt_tokens / ttft_s if ttft_s else None,
        vs_whole_1_thread=paired_ratio(subject.ttft_s, reference),
        first_token=subject.first_tokens[0] if subject.first_tokens else None,
        shard_prefill_tok_s=tuple(prompt_tokens / b for b in busy) if all(b > 0 for b in busy) else (),
        shard_busy_ms=tuple(b * 1000.0 for b in busy),
    )
