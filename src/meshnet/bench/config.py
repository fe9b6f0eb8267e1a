"""The bench's one typed configuration, its full and quick presets, and lane names.

A lane is named ``kind`` or ``kind-N`` (N = shards): ``llama-whole``, ``split-2``, ``meshnet-3``,
``recompute``; ``llama-whole-T-threads`` is whole-model with T llama.cpp threads instead of the
bench's ``threads`` (issue 34's sweep sets whole-model on the same two cores as a pinned
meshnet-2). Every lane runs the same workload: the same prompts, output length, greedy
sampling, thread count (but for those lanes) and KV geometry, so their numbers compare directly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from meshnet.core.config_flags import PROVISIONED_MODEL, cli
from meshnet.core.errors import InvalidArgument
from meshnet.engine.llama_config import LlamaConfig
from meshnet.node.config import WorkerConfig

LaneKind = Literal["llama-whole", "split", "meshnet", "recompute"]
REFERENCE_LANE = "llama-whole"
"""Every drift and ratio is measured against this lane: whole-model llama.cpp, the speed anchor."""
QUICK_PREFILL_PROMPT_TOKENS = 256
WHOLE_THREADS = re.compile(r"llama-whole-(\d+)-threads?")
DEFAULT_LANES = (
    "llama-whole",
    "split-2",
    "split-3",
    "recompute",
    "meshnet-1",
    "meshnet-2",
    "meshnet-3",
)


@dataclass(frozen=True)
class LaneName:
    kind: LaneKind
    shards: int
    threads: int | None = None
    """llama.cpp threads of this lane's context when not the bench's ``threads`` (whole-model only)."""

    def __str__(self) -> str:
        if self.threads is not None:
            return f"{self.kind}-{self.threads}-thread{'s' if self.threads > 1 else ''}"
        return self.kind if self.kind in ("llama-whole", "recompute") else f"{self.kind}-{self.shards}"


def parse_lane(text: str, recompute_shards: int = 3) -> LaneName:
    """``"split-3"`` -> LaneName("split", 3); fails loudly on anything it does not know."""
    if text == "llama-whole":
        return LaneName("llama-whole", 1)
    if text == "recompute":
        return LaneName("recompute", recompute_shards)
    match = WHOLE_THREADS.fullmatch(text)
    if match is not None:
        lane = LaneName("llama-whole", 1, int(match.group(1)))
        if int(match.group(1)) >= 1 and str(lane) == text:  # "1-thread", "2-threads": one spelling each
            return lane
    kind, _, count = text.partition("-")
    if kind in ("split", "meshnet") and count.isdigit() and int(count) >= 1:
        return LaneName(kind, int(count))  # type: ignore[arg-type]
    raise InvalidArgument(
        f"unknown lane {text!r}: use llama-whole, llama-whole-T-threads, split-N, meshnet-N or recompute"
    )


@dataclass(frozen=True)
class BenchConfig:
    model: Path = field(metadata=cli(shown_default=PROVISIONED_MODEL))
    """Source GGUF every lane runs."""
    data_dir: Path
    """Slice cache (shared with the workers), worker logs."""
    lanes: tuple[str, ...] = DEFAULT_LANES
    """Lanes to measure: llama-whole, split-N, meshnet-N, recompute (transformers is an extra lane)."""
    threads: int = 1
    """llama.cpp threads per context, the same in every lane and every worker. One by default:
    on a shared 2-core machine a 2-thread team collapses (measured 5-20x slower) whenever
    anything else wants a core, which would drown the ratios this bench exists for."""
    prompt_tokens: int = 128
    """Tokens of every prompt."""
    output_tokens: int = 64
    """Tokens generated per request (greedy)."""
    recompute_output_tokens: int = 8
    """Recompute re-runs the whole sequence per token; fewer tokens keep its lane bounded."""
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    """The concurrency sweep, for ``sweep_lanes``."""
    sweep_lanes: tuple[str, ...] = ("llama-whole", "split-3", "meshnet-3")
    """Lanes measured at every concurrency; the others at ``lane_concurrency`` only (time budget)."""
    lane_concurrency: tuple[int, ...] = (1, 4)
    """Concurrencies the lanes outside ``sweep_lanes`` are measured at."""
    top_concurrency_lanes: tuple[str, ...] = ("meshnet-2",)
    """Lanes outside the sweep measured at its top concurrency too: issue 15 judges the pinned
    two-worker route at concurrency 8 against whole-model with 1 thread batching 8."""
    repetitions: int = 3
    """Interleaved rounds (every lane once per round); medians are taken across rounds."""
    max_slots: int = 8
    """KV slots per context (and per worker): the largest concurrency the bench may ask for."""
    n_ctx_per_slot: int = field(default=2048, metadata=cli("context"))
    """Positions per session in every lane."""
    prefill_chunk: int = WorkerConfig.prefill_chunk
    """Tokens per prefill llama_decode call: the same in process and in workers (fixes numerics)."""
    contexts: tuple[int, ...] = (128, 512, 2048, 8000)
    """Context lengths for decode-latency scaling (clamped to the model's context)."""
    context_lane: str = "meshnet-3"
    """The KV-cached lane compared with recompute at each context (meshnet-N or split-N)."""
    context_decode_tokens: int = 8
    """Tokens decoded at each context length."""
    recompute_max_step_s: float = field(default=45.0, metadata=cli("recompute-max-step"))
    """Above this estimated cost per step, in-process recompute is not run at a context: one
    recompute step is a prefill of the whole context, so the cached route's own prefill time
    (TTFT) stands in for it, and the results say so."""
    prefill_prompt_tokens: int = field(default=2048, metadata=cli("prefill-prompt"))
    """Tokens of the prefill phase's one long prompt (``bench.prefill``: TTFT of the pinned
    ``prefill_lane`` vs whole-model at 1 and 2 threads); 0 skips the phase."""
    prefill_lane: str = "meshnet-2"
    """The worker route of the prefill phase; its workers are always pinned, one core each."""
    prefill_budget_s: float = field(default=90.0, metadata=cli("prefill-budget"))
    """Seconds the prefill phase may take (start-up included): a further round (up to
    ``repetitions``) starts only when the last round's duration still fits."""
    recompute_shards: int = 3
    """Shards of the recompute lane's route."""
    time_budget_s: float = field(default=840.0, metadata=cli("budget"))
    """Seconds the run may take: new rounds stop starting once 60% of this is spent; the context
    phase bounds itself. --quick makes it 300."""
    request_timeout_s: float = field(default=300.0, metadata=cli("request-timeout"))
    """Seconds one request through a worker route may take."""
    worker_start_timeout_s: float = field(default=120.0, metadata=cli("worker-start-timeout"))
    """Seconds the bench waits for its workers to print their ready line."""
    pin_workers: bool = True
    """Pin worker i of every meshnet lane to core i mod the usable cores (and the llama-rpc-3
    processes likewise), so a route's processes do not migrate and fight over one core."""
    calibrate_split: bool = True
    """Split the decode routes of several shards by the engine's measured CPU a row at the
    workload's mean decode position (``bench.split_calibration``); off: by weight elements alone."""
    extra_lanes: tuple[str, ...] = ("synthetic-1b", "llama-rpc-3", "transformers")
    """Lanes outside the sweep (``bench.extra_lanes``): synthetic-1b, llama-rpc-3, transformers (the
    design documents' baseline: needs the ``baseline`` extra, else skipped with the reason); empty skips."""
    build_llama_rpc: bool = False
    """Build the llama-rpc-3 binaries when they are not cached yet (the setup step: ~20-40 min on
    2 cores); without it an uncached lane is skipped with that reason."""
    llama_source: Path | None = None
    """Unpacked llama.cpp source for the llama-rpc-3 build; none downloads the pinned
    llama-cpp-python sdist with pip. The build is cached under the data dir."""
    command: str = ""
    """The exact command line, recorded in the results."""
    quick: bool = False
    """Preset: fewer rounds, shorter outputs, concurrency 1 and 4; flags given with it still apply."""
    gemma3: bool = False
    """Preset: the gemma3 lane set (bench/gemma3.py): Gemma 3 270M, llama-whole vs meshnet-3."""
    synthetic_3b: bool = False
    """Preset: the synthetic-3b lane set (bench/synthetic_3b.py): a random-weight Llama-3.2-3B-shaped
    Q4_0 model, llama-whole vs meshnet-2, meshnet-3 and llama-rpc-3, one stream."""
    concurrency_sweep: bool = False
    """Preset (``sweep_config``): issue 34's sweep, pinned meshnet-2 against whole-model with 1
    thread and with 2 threads at concurrency 1/2/4/8/16; combines with ``synthetic_3b``."""
    note: str = ""
    """A line recorded in the results' run notes (say there, e.g., that a run is a short smoke run)."""

    def __post_init__(self) -> None:
        for lane in self.lanes:
            parse_lane(lane, self.recompute_shards)
        if not self.concurrency or min(self.concurrency) < 1 or max(self.concurrency) > self.max_slots:
            raise InvalidArgument(f"concurrency must lie in 1..{self.max_slots} (the KV slots), got {self.concurrency}")
        if self.threads < 1 or self.repetitions < 1 or self.output_tokens < 2 or self.prompt_tokens < 1:
            raise InvalidArgument("threads and repetitions must be >= 1, output_tokens >= 2, prompt_tokens >= 1")
        if self.prompt_tokens + self.output_tokens > self.n_ctx_per_slot:
            raise InvalidArgument("prompt_tokens + output_tokens must fit n_ctx_per_slot")
        if self.prefill_prompt_tokens < 0 or parse_lane(self.prefill_lane).kind != "meshnet":
            raise InvalidArgument("prefill_prompt_tokens must be >= 0 (0 skips) and prefill_lane a meshnet-N lane")
        if self.contexts:
            kind = parse_lane(self.context_lane, self.recompute_shards).kind
            if kind not in ("meshnet", "split"):
                raise InvalidArgument(f"context_lane must be meshnet-N or split-N, got {self.context_lane}")

    def llama_config(
        self, *, max_slots: int | None = None, n_ctx_per_slot: int | None = None, threads: int | None = None
    ) -> LlamaConfig:
        """The in-process lanes' engine settings (the context phase asks for one larger slot, a
        ``llama-whole-T-threads`` lane for its own threads)."""
        return LlamaConfig(
            n_threads=self.threads if threads is None else threads,
            max_slots=self.max_slots if max_slots is None else max_slots,
            n_ctx_per_slot=self.n_ctx_per_slot if n_ctx_per_slot is None else n_ctx_per_slot,
            max_batch_tokens=self.prefill_chunk,
        )

    def lane_names(self) -> list[LaneName]:
        return [parse_lane(lane, self.recompute_shards) for lane in self.lanes]

    def measures(self, lane: LaneName, concurrency: int) -> bool:
        """Whether ``lane`` is run at ``concurrency`` in each round."""
        if lane.kind == "recompute":
            return concurrency == 1  # no KV cache, so nothing to batch
        if str(lane) in self.top_concurrency_lanes and concurrency == max(self.concurrency):
            return True
        return str(lane) in self.sweep_lanes or concurrency in self.lane_concurrency


def quick_config(config: BenchConfig) -> BenchConfig:
    """The ``--quick`` preset: every lane, fewer rounds, shorter outputs, two concurrencies, no
    extra lanes, a 256-token prompt for the prefill phase."""
    return replace(
        config,
        quick=True,
        prompt_tokens=64,
        output_tokens=24,
        recompute_output_tokens=4,
        concurrency=(1, 4),
        repetitions=2,
        contexts=(128, 512),
        context_decode_tokens=4,
        time_budget_s=300.0,
        extra_lanes=(),
        prefill_prompt_tokens=min(config.prefill_prompt_tokens, QUICK_PREFILL_PROMPT_TOKENS),
        prefill_budget_s=30.0,
    )


SWEEP_LANES = ("llama-whole", "llama-whole-2-threads", "meshnet-2")
SWEEP_CONCURRENCY = (1, 2, 4, 8, 16)


def sweep_config(config: BenchConfig) -> BenchConfig:
    """The ``--concurrency-sweep`` preset: the sweep's lanes join the run's (the route's workers
    pinned one core each, whole-model with 1 thread and with 2 on the same two cores), each
    measured at every concurrency of the sweep; the run's other lanes keep their own
    concurrencies. KV slots grow to the top concurrency."""
    lanes = config.lanes + tuple(lane for lane in SWEEP_LANES if lane not in config.lanes)
    return replace(
        config,
        concurrency_sweep=True,
        lanes=lanes,
        sweep_lanes=SWEEP_LANES,
        concurrency=SWEEP_CONCURRENCY,
        max_slots=max(SWEEP_CONCURRENCY),
        top_concurrency_lanes=(),
        pin_workers=True,
    )
