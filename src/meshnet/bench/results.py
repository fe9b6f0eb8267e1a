"""Every value of a bench results file, as frozen dataclasses, and their JSON form.

One file holds every type the results document is made of, so the runner that fills it, the
report that reads it and ``results.schema.json`` that describes it can be checked against one
place. Field names are the JSON keys; integer-keyed maps (concurrency, context) are written with
string keys, as JSON requires. ``to_json`` and ``from_json`` are the only conversions (pydantic
reads the dataclasses' annotations); the schema itself is checked on the JSON side
(``results_file``), where its violations can be reported by path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import TypeAdapter

SCHEMA_NAME = "meshnet-bench-results"
SCHEMA_VERSION = 2
"""2 adds the optional ``prefill`` section; files of version 1 are still read (without it)."""
LaneStatus = Literal["ok", "skipped", "failed"]
Placement = Literal["in-process", "workers", "none"]


@dataclass(frozen=True)
class RunInfo:
    timestamp: str
    command: str
    quick: bool
    duration_s: float
    time_budget_s: float
    rounds_completed: int
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelInfo:
    path: str
    name: str
    sha256: str
    bytes: int
    n_layers: int
    n_embd: int
    context_length: int


@dataclass(frozen=True)
class Hardware:
    cpu_count: int
    cpu_model: str
    memory_bytes: int
    platform: str = ""
    machine: str = ""
    python_executable: str = ""


@dataclass(frozen=True)
class Environment:
    runtime: dict[str, str]
    """Package name -> version, ``python`` first."""
    hardware: Hardware


@dataclass(frozen=True)
class Workload:
    """What every lane ran: the same prompts, lengths, sampling, threads and KV geometry."""

    lanes: tuple[str, ...]
    prompts: int
    prompt_tokens: int
    output_tokens: int
    recompute_output_tokens: int
    threads: int
    concurrency: tuple[int, ...]
    repetitions: int
    max_slots: int
    n_ctx_per_slot: int
    prefill_chunk: int
    sweep_lanes: tuple[str, ...] = ()
    lane_concurrency: tuple[int, ...] = ()
    top_concurrency_lanes: tuple[str, ...] = ()
    contexts: tuple[int, ...] = ()
    context_lane: str = ""
    sampling: Literal["greedy"] = "greedy"
    interleaved: bool = True


@dataclass(frozen=True)
class Measures:
    """One lane at one concurrency over its rounds (definitions in ``stats``)."""

    concurrency: int
    rounds: int
    requests: int
    failures: int
    ttft_ms: float | None
    prefill_tok_s: float | None
    decode_tok_s: float | None
    token_latency_ms_p50: float | None
    token_latency_ms_p95: float | None
    request_latency_ms_p50: float | None
    request_latency_ms_p95: float | None
    aggregate_tok_s: float | None
    aggregate_decode_tok_s: float | None
    batch_occupancy: float | None
    vs_reference: dict[str, float | None]
    """Median of per-round ratios against the reference lane, per rate."""
    errors: tuple[str, ...] = ()
    aggregate_decode_tok_s_rounds: tuple[float, ...] = ()
    token_agreement: float | None = None
    first_divergence: int | None = None
    seam_messages_per_token: float | None = None
    """Median over rounds of gRPC messages between the route's shards per token streamed
    (``stats.seam_messages_per_token``); absent for lanes without worker seams."""
    steady_token_latency_ms_p50: float | None = None
    steady_token_latency_ms_p95: float | None = None
    """Token gaps inside the steady state only (``stats.steady_token_gaps``): the decode itself,
    without the prompts still prefilling when the streams start together; absent in runs before."""


@dataclass(frozen=True)
class Drift:
    token_agreement: float | None
    compared_tokens: int
    first_divergence: int | None
    max_logit_diff: float | None
    note: str = ""


@dataclass(frozen=True)
class HopCompute:
    address: str
    layers: str
    compute_ms_p50: float | None
    compute_ms_p95: float | None


@dataclass(frozen=True)
class HopTiming:
    """A probe session's decode steps split into the shards' compute and per-link latency."""

    probe_tokens: int
    step_ms_p50: float | None
    step_ms_p95: float | None
    compute_ms_per_token_p50: float | None
    link_ms_p50: float | None
    link_ms_p95: float | None
    links: int
    """One-way crossings of a probe step's round trip (client->head, the seams, head->client);
    ``link_ms`` is per crossing."""
    hops: tuple[HopCompute, ...]
    seam_crossings_per_token: int | None = None
    """Between shards only: N on the ring (2(N-1) on the chain it replaced)."""


@dataclass(frozen=True)
class LinkBytes:
    link: str
    forward_bytes: int
    backward_bytes: int


@dataclass(frozen=True)
class WireBytes:
    links: tuple[LinkBytes, ...]
    bytes_per_token_per_hop: int
    hidden_payload_bytes: int
    framing_bytes_per_message: int
    bytes_per_token_total: int


@dataclass(frozen=True)
class LaneResult:
    kind: str
    shards: int
    status: LaneStatus
    reason: str | None
    placement: Placement
    artifact_bytes: int | None
    rss_bytes: int | None
    rss_bytes_per_process: tuple[int, ...]
    seams: int
    seam_bytes_per_token: float | None
    failures: int
    concurrency: dict[int, Measures]
    drift: Drift
    hop_timing: HopTiming | None
    wire: WireBytes | None
    rss_note: str = ""

    def at(self, concurrency: int) -> Measures | None:
        return self.concurrency.get(concurrency)


@dataclass(frozen=True)
class SkippedContext:
    context: int
    skipped: str
    """Why the context was not measured (the time budget)."""


@dataclass(frozen=True)
class ContextPoint:
    context: int
    fast_ms_per_token: float | None
    fast_ttft_ms: float | None
    fast_tokens_measured: int
    slow_ms_per_token: float | None
    slow_tokens_measured: int
    slow_source: str
    speedup: float | None
    first_token_agrees: bool | None
    error: str | None


@dataclass(frozen=True)
class ContextScaling:
    fast_lane: str
    points: dict[int, SkippedContext | ContextPoint]
    note: str = ""
    slow_lane: str = "recompute"


@dataclass(frozen=True)
class CpuSample:
    """How busy the machine was during one round, and how much of that was the bench."""

    wall_s: float
    machine_busy_cores: float
    own_cores: float
    foreign_cores: float


@dataclass(frozen=True)
class Noise:
    rounds: tuple[CpuSample, ...]
    foreign_cores_median: float | None


@dataclass(frozen=True)
class ExtraLane:
    """A lane outside the main sweep (another model, another runtime), as a ratio to its own
    whole-model run; ``skipped`` says why it was not measured (never a made-up number)."""

    decode_tok_s: float | None
    whole_decode_tok_s: float | None
    vs_whole: float | None
    token_agreement: float | None
    note: str
    skipped: str | None = None
    token_agreement_per_prompt: tuple[float, ...] = ()
    """Per prompt, in the workload's order, where the lane compares several (``transformers``)."""


@dataclass(frozen=True)
class PrefillLane:
    """One way of running a long prompt's prefill (``bench.prefill``), over its rounds."""

    lane: str
    """The lane kind it reuses: ``llama-whole`` or ``meshnet-N``."""
    threads: int
    """llama.cpp threads per process."""
    processes: int
    pinning: str
    """How its processes were placed on cores, as the report states it."""
    status: LaneStatus
    reason: str | None
    ttft_ms: float | None
    """Median over rounds: request start -> first token streamed (the whole prompt's prefill)."""
    ttft_ms_rounds: tuple[float, ...]
    prefill_tok_s: float | None
    """Prompt tokens / median TTFT."""
    vs_whole_1_thread: float | None
    """Median of per-round TTFT ratios to whole-model with 1 thread (below 1: faster)."""
    first_token: int | None
    shard_prefill_tok_s: tuple[float, ...] = ()
    """Worker routes: per shard, prompt tokens / the shard's engine-busy seconds in the run."""
    shard_busy_ms: tuple[float, ...] = ()
    """Worker routes: per shard, median engine-busy milliseconds of one prefill run."""


@dataclass(frozen=True)
class PrefillPhase:
    """TTFT of one long prompt: a pinned meshnet route vs whole-model llama.cpp at 1 and 2 threads."""

    prompt_tokens: int
    prefill_chunk: int
    """Tokens per prefill chunk (the route pipelines chunks across its shards)."""
    rounds: int
    quick: bool
    """A quick run measures a shorter prompt than the full run's 2,048 tokens."""
    lanes: dict[str, PrefillLane]
    first_token_agrees: bool | None
    """Whether every lane (every round) produced the same greedy first token; None below two lanes."""
    note: str = ""
    foreign_cores: float | None = None
    """CPU the rest of the machine used meanwhile (``CpuMeter``): a large value is a noisy phase."""


@dataclass(frozen=True)
class BenchResults:
    run: RunInfo
    model: ModelInfo
    environment: Environment
    workload: Workload
    lanes: dict[str, LaneResult]
    context_scaling: ContextScaling | None
    noise: Noise
    extra_lanes: dict[str, ExtraLane] = field(default_factory=dict)
    """``synthetic-1b``, ``llama-rpc-3`` (``bench.extra_lanes``)."""
    prefill: PrefillPhase | None = None
    """TTFT of a long prompt (``bench.prefill``); absent in files of schema version 1."""
    schema: str = SCHEMA_NAME
    schema_version: int = SCHEMA_VERSION

    def lane(self, name: str) -> LaneResult | None:
        return self.lanes.get(name)

    def measures(self, lane: str, concurrency: int = 1) -> Measures | None:
        entry = self.lanes.get(lane)
        return entry.at(concurrency) if entry is not None else None


def to_json(results: BenchResults) -> dict[str, Any]:
    """The JSON document of a run: dataclasses become objects keyed by field name."""
    document: dict[str, Any] = TypeAdapter(BenchResults).dump_python(results, mode="json")
    if not document.get("extra_lanes"):
        document.pop("extra_lanes", None)  # absent in files written before extra lanes existed
    if not document["workload"].get("top_concurrency_lanes"):
        document["workload"].pop("top_concurrency_lanes", None)  # a field newer than the file
    for extra in document.get("extra_lanes", {}).values():
        if not extra.get("token_agreement_per_prompt"):
            extra.pop("token_agreement_per_prompt", None)  # only the lanes that compare several prompts
    if document.get("prefill") is None:
        document.pop("prefill", None)  # not measured: absent, as in files of schema version 1
    for lane in document.get("lanes", {}).values():
        for measures in lane.get("concurrency", {}).values():
            if measures.get("seam_messages_per_token") is None:
                measures.pop("seam_messages_per_token", None)  # no worker seams: absent, not null
            for steady in ("steady_token_latency_ms_p50", "steady_token_latency_ms_p95"):
                if measures.get(steady) is None:
                    measures.pop(steady, None)  # no steady window, or a file older than the field
        hops = lane.get("hop_timing")
        if hops is not None and hops.get("seam_crossings_per_token") is None:
            del hops["seam_crossings_per_token"]  # a field newer than the file: absent, not null
    return document


def from_json(document: dict[str, Any]) -> BenchResults:
    """Typed results from a (schema-checked) document; keys the types do not name are ignored."""
    return TypeAdapter(BenchResults).validate_python(document)
