"""Run every lane on one workload, interleaved round by round, and assemble the results.

Order of a run: open the in-process lanes and start the workers (every lane stays loaded, so a
round can visit them all); warm every lane up; take the reference tokens (and slot-0 logits) from
``llama-whole``; then rounds. A round visits every concurrency and, at each, every lane, in an
order rotated from round to round: on a shared machine the lanes see the same weather, and
per-round ratios against the reference cancel slow drifts. After the rounds: per-hop probes of
the meshnet routes, memory, then the context-scaling phase on fresh, long-context engines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import ModelDescription, decode_work
from meshnet.bench.config import REFERENCE_LANE, BenchConfig, LaneName
from meshnet.bench.environment import CpuMeter, rss_bytes
from meshnet.bench.hops import RouteProbe
from meshnet.bench.inprocess import CachedLane, RecomputeLane
from meshnet.bench.pinning import decode_split
from meshnet.bench.remote import MeshnetLane
from meshnet.bench.results import CpuSample, Drift, LaneResult, Measures
from meshnet.bench.split_calibration import SplitCalibration, calibrate
from meshnet.bench.stats import RunRecord, median, summarize, token_agreement
from meshnet.bench.tickets import LaneTickets
from meshnet.bench.workers import WorkerOptions, WorkerSet, client_security
from meshnet.core.errors import MeshnetError
from meshnet.core.layers import LayerRange
from meshnet.engine.shards import open_local_route
from meshnet.route.driver import RouteDriver
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire.frames import DEFAULT_MAX_FRAME_BYTES

log = logging.getLogger(__name__)
Progress = Callable[[str], None]
ROUNDS_SHARE_OF_BUDGET = 0.6
"""Rounds stop starting once this share of the budget is spent, leaving room for the rest."""
WARMUP_TOKENS = 4


@dataclass
class LaneState:
    """A lane while the bench runs: its engine, what it measured, and what went wrong."""

    name: LaneName
    engine: CachedLane | RecomputeLane | MeshnetLane | None = None
    workers: WorkerSet | None = None
    status: Literal["ok", "failed"] = "ok"
    reason: str | None = None
    artifact_bytes: int | None = None
    rss: list[int] = field(default_factory=list)
    rss_note: str = ""
    seam_bytes_per_token: float | None = None
    runs: dict[int, list[RunRecord | None]] = field(default_factory=dict)
    logits: tuple[np.ndarray, ...] = ()
    probe: RouteProbe | None = None

    @property
    def label(self) -> str:
        return str(self.name)

    def fail(self, reason: str) -> None:
        self.status, self.reason, self.engine = "failed", reason, None


class LaneSet:
    """Opens, runs and closes every lane of a bench; owns the pool, the routes and the workers."""

    def __init__(
        self,
        config: BenchConfig,
        cache: SliceCache,
        model: ModelDescription,
        progress: Progress,
        *,
        prefill: bool = False,
    ) -> None:
        self.config = config
        self.cache = cache
        self.model = model
        self.n_layers = model.n_layers
        self.work = decode_work(model.path)
        self.prefill = prefill
        """Where the layers split: each shard as busy as the others for the work measured, per
        decoded token (the LM head counted on the tail) or, for a prefill phase, per prompt."""
        self.progress = progress
        security = client_security(config.data_dir)
        self.pool = ChannelPool(DEFAULT_MAX_FRAME_BYTES, security)
        self.tickets = LaneTickets(config.data_dir, security)
        self.driver = RouteDriver(self.pool, max_frame_bytes=DEFAULT_MAX_FRAME_BYTES)
        self.llama = config.llama_config()
        self.lanes = [LaneState(name) for name in config.lane_names()]
        self.notes: list[str] = []
        """What the report must state about how the lanes ran (pinning, the measured split)."""
        self._calibration: SplitCalibration | None = None

    def ranges(self, shards: int) -> list[LayerRange]:
        if self.prefill:
            return self.work.prefill_split(shards)
        if shards < 2 or not self.config.calibrate_split:
            return decode_split(self.work, shards, pinned=self.config.pin_workers)
        if self._calibration is None:
            position = self.config.prompt_tokens + self.config.output_tokens // 2  # the mean decode position
            sessions = max(self.config.concurrency)
            self._calibration = calibrate(
                self.model, self.work, self.cache, self.llama, position=position, sessions=sessions
            )
        ranges = decode_split(self._calibration.work, shards, pinned=self.config.pin_workers)
        counted = decode_split(self.work, shards, pinned=self.config.pin_workers)
        note = self._calibration.describe(counted, ranges)
        if note not in self.notes:
            self.notes.append(note)
        return ranges

    def artifact_bytes(self, shards: int) -> int:
        """Bytes of the files a route of ``shards`` loads: its slices and the head's token table."""
        total = 0
        for layers in self.ranges(shards):
            files = self.cache.shard_files(self.config.model, layers, self.n_layers)
            total += files.slice.stat().st_size + (files.embeddings.stat().st_size if files.embeddings else 0)
        return total

    def open(self) -> None:
        for lane in self.lanes:
            try:
                self._open_lane(lane)
            except MeshnetError as error:
                lane.fail(f"could not start: {error.code}: {error.message}")
                self.progress(f"{lane.label}: {lane.reason}")

    def _open_lane(self, lane: LaneState) -> None:
        kind, shards = lane.name.kind, lane.name.shards
        lane.artifact_bytes = self.artifact_bytes(shards)
        if kind == "meshnet":
            options = WorkerOptions(
                self.config.model,
                self.config.data_dir,
                self.config.threads,
                self.config.max_slots,
                self.config.n_ctx_per_slot,
                self.config.prefill_chunk,
                pin=self.config.pin_workers,
            )
            lane.workers = WorkerSet(lane.label, self.ranges(shards), options, self.config.worker_start_timeout_s)
            lane.engine = MeshnetLane(
                lane.workers, self.pool, self.driver, timeout_s=self.config.request_timeout_s, tickets=self.tickets
            )
            lane.rss_note = "resident memory of each worker process"
            addresses = ", ".join(address for address, _ in lane.workers.endpoints)
            self.progress(f"{lane.label}: {shards} worker(s) at {addresses}")
            self.notes.append(f"{lane.label} workers: {lane.workers.pinning}")
            return
        before = rss_bytes()
        llama = self.llama if lane.name.threads is None else self.config.llama_config(threads=lane.name.threads)
        route = open_local_route(self.model, shards, self.cache, llama, self.ranges(shards))
        lane.rss = [max(rss_bytes() - before, 0)]
        lane.rss_note = "growth of the bench process's resident memory when the lane's engines were opened"
        lane.engine = RecomputeLane(route) if kind == "recompute" else CachedLane(route)
        self.progress(f"{lane.label}: {shards} in-process shard(s) loaded")

    def measurable(self) -> list[LaneState]:
        return [lane for lane in self.lanes if lane.engine is not None]

    def worker_pids(self) -> list[int]:
        return [pid for lane in self.lanes if lane.workers for pid in lane.workers.pids]

    async def run(
        self,
        lane: LaneState,
        prompts: tuple[tuple[int, ...], ...],
        max_tokens: int,
        *,
        indices: list[int] | None = None,
        keep_logits: bool = False,
    ) -> RunRecord:
        indices = list(range(len(prompts))) if indices is None else indices
        engine = lane.engine
        if isinstance(engine, MeshnetLane):
            return await engine.run(prompts, indices, max_tokens)
        if isinstance(engine, RecomputeLane):
            outcome = engine.run(prompts, indices, min(max_tokens, self.config.recompute_output_tokens))
        elif isinstance(engine, CachedLane):
            outcome = engine.run(prompts, indices, max_tokens, keep_logits=keep_logits)
            lane.logits = outcome.logits or lane.logits
        else:
            raise MeshnetError(f"lane {lane.label} has no engine")
        lane.seam_bytes_per_token = outcome.seam_bytes_per_token if engine.seams else 0.0
        return outcome.record

    async def close(self) -> None:
        for lane in self.lanes:
            engine = lane.engine
            if isinstance(engine, CachedLane | RecomputeLane):
                engine.route.close()
            if lane.workers is not None:
                lane.workers.stop()
            lane.engine = None
        await self.pool.close()


async def run_rounds(
    lanes: LaneSet, prompts: tuple[tuple[int, ...], ...], started: float
) -> tuple[int, list[CpuSample]]:
    """Interleaved rounds; returns the rounds completed and each round's CPU noise record."""
    config = lanes.config
    noise = []
    completed = 0
    for round_index in range(config.repetitions):
        if round_index and time.monotonic() - started > ROUNDS_SHARE_OF_BUDGET * config.time_budget_s:
            lanes.progress(f"time budget: stopping after {round_index} round(s)")
            break
        meter = CpuMeter(lanes.worker_pids())
        # A lane that failed mid-bench keeps a None per round, so rounds stay paired by index.
        taking_part = [lane for lane in lanes.lanes if lane.engine is not None or lane.runs]
        shift = round_index % max(len(taking_part), 1)
        order = taking_part[shift:] + taking_part[:shift]
        for k in config.concurrency:
            for lane in order:
                if not config.measures(lane.name, k):
                    continue
                lane.runs.setdefault(k, []).append(await _measured(lanes, lane, prompts[:k]))
        noise.append(meter.read())
        completed += 1
        lanes.progress(
            f"round {round_index + 1}/{config.repetitions} done "
            f"({time.monotonic() - started:.0f} s, other load {noise[-1].foreign_cores:.2f} cores)"
        )
    return completed, noise


async def _measured(lanes: LaneSet, lane: LaneState, prompts: tuple[tuple[int, ...], ...]) -> RunRecord | None:
    if lane.engine is None:
        return None
    try:
        return await lanes.run(lane, prompts, lanes.config.output_tokens)
    except MeshnetError as error:
        lane.fail(f"failed mid-bench: {error.code}: {error.message}")
        lanes.progress(f"{lane.label}: {lane.reason}")
        return None


def lane_result(
    lane: LaneState, reference: LaneState | None, reference_tokens: dict[int, tuple[int, ...]]
) -> LaneResult:
    """What the results file records of a lane, its drift measured against the reference's tokens."""
    concurrency: dict[int, Measures] = {}
    for k, records in sorted(lane.runs.items()):
        if any(records):
            paired = reference.runs.get(k, []) if reference is not None else []
            agreement = token_agreement([r for r in records if r is not None], reference_tokens)
            concurrency[k] = replace(
                summarize(records, paired),
                token_agreement=agreement.token_agreement,
                first_divergence=agreement.first_divergence,
            )
    all_runs = [r for records in lane.runs.values() for r in records if r is not None]
    agreement = token_agreement(all_runs, reference_tokens)
    kind = lane.name.kind
    return LaneResult(
        kind=kind,
        shards=lane.name.shards,
        status=lane.status,
        reason=lane.reason,
        placement="workers" if kind == "meshnet" else "in-process",
        artifact_bytes=lane.artifact_bytes,
        rss_bytes=sum(lane.rss) if lane.rss else None,
        rss_bytes_per_process=tuple(lane.rss),
        rss_note=lane.rss_note,
        seams=lane.name.shards - 1,
        seam_bytes_per_token=_seam_bytes(lane),
        failures=sum(1 for r in all_runs for t in r.requests if t.error is not None),
        concurrency=concurrency,
        drift=Drift(
            token_agreement=agreement.token_agreement,
            compared_tokens=agreement.compared_tokens,
            first_divergence=agreement.first_divergence,
            max_logit_diff=_max_logit_diff(lane, reference, agreement.first_divergence),
            note=f"{_drift_note(kind)}; {_distinct_tokens(all_runs)}",
        ),
        hop_timing=lane.probe.timing if lane.probe else None,
        wire=lane.probe.wire if lane.probe else None,
    )


def _max_logit_diff(lane: LaneState, reference: LaneState | None, first_divergence: int | None) -> float | None:
    """Largest logit difference from the reference over slot 0's steps, up to the first divergence."""
    if not lane.logits or reference is None or not reference.logits:
        return None
    limit = len(lane.logits) if first_divergence is None else first_divergence + 1
    pairs = list(zip(lane.logits, reference.logits, strict=False))[:limit]
    diffs = [float(np.max(np.abs(a - b))) for a, b in pairs]
    return max(diffs) if diffs else None


def _seam_bytes(lane: LaneState) -> float | None:
    if lane.name.kind == "meshnet" and lane.probe and lane.probe.wire:
        return float(lane.probe.wire.bytes_per_token_per_hop)
    return lane.seam_bytes_per_token


def _distinct_tokens(runs: list[RunRecord]) -> str:
    """How varied the lane's output was: agreement over a degenerate model (one token repeated)
    would read as perfect, so the count says whether it compared anything."""
    generated = [token for record in runs for trace in record.requests for token in trace.tokens]
    return f"{len(set(generated))} distinct token ids among {len(generated)} generated"


def _drift_note(kind: str) -> str:
    if kind == "meshnet":
        return "tokens vs llama-whole at concurrency 1; logits do not leave the tail, so no logit diff"
    if kind == "recompute":
        return "recompute runs every token as a prefill (other kernel paths than decode): drift here is expected"
    return "tokens vs llama-whole at concurrency 1; max logit diff over slot 0's steps up to the first divergence"


def median_foreign(noise: list[CpuSample]) -> float | None:
    return median([n.foreign_cores for n in noise])


def reference_lane(lanes: LaneSet) -> LaneState | None:
    return next((lane for lane in lanes.lanes if lane.label == REFERENCE_LANE), None)
