"""The arguments of the subcommands that have no component config of their own.

Their flags are generated from these fields like every other config's (``core.config_flags``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from meshnet.core.addresses import parse_address_list
from meshnet.core.config_flags import PROVISIONED_MODEL, cli
from meshnet.core.devices import AUTO, CPU, DeviceInfo, DeviceRequest
from meshnet.core.errors import InvalidArgument
from meshnet.core.generation import SamplingParams
from meshnet.core.kv_type import KvType
from meshnet.core.layers import LayerRange
from meshnet.deploy.lab.plan import SWEEP_DELAYS_MS, SWEEP_RATES_MBIT
from meshnet.engine.llama_config import LlamaConfig
from meshnet.node.config import WorkerConfig


@dataclass(frozen=True)
class ProvisionArguments:
    name: str = field(default="smollm2", metadata=cli(positional=True))
    """Which model: smollm2, gemma3-270m, or a random-weight one written here (synthetic-1b, synthetic-3b)."""


@dataclass(frozen=True)
class SliceArguments:
    source: Path = field(metadata=cli(positional=True))
    """Source GGUF to cut the slice from."""
    layers: LayerRange
    """Layers of the slice, A:B half-open (B exclusive)."""
    output: Path = field(metadata=cli(short="o"))
    """Where the slice is written (a head slice also writes OUTPUT's .embeddings.gguf)."""


@dataclass(frozen=True)
class PublishArguments:
    source: Path = field(metadata=cli(positional=True))
    """Source GGUF to publish as a signed manifest and per-block artifacts."""
    out: Path
    """Directory that receives manifest.json and artifacts/<sha256>."""
    name: str | None = None
    """Model id peers fetch it by; none uses the file's stem."""
    license: str = "unknown"
    """License of the weights, recorded in the manifest."""
    key: Path | None = None
    """Publisher Ed25519 key (PEM); none uses DATA_DIR/keys/publisher.key, created 0600 if missing."""
    repo: str = ""
    """Upstream repository the GGUF came from, recorded in the manifest."""
    revision: str = ""
    """Upstream revision, recorded in the manifest."""


@dataclass(frozen=True)
class GenerateConfig:
    """``meshnet generate``: one prompt through an in-process route of N llama.cpp shards."""

    prompt: str = field(metadata=cli(positional=True))
    """The user message, sent through the model's chat template (or as is, with --raw)."""
    model: Path = field(metadata=cli(shown_default=PROVISIONED_MODEL))
    """Source GGUF."""
    raw: bool = False
    """Complete the prompt as plain text, without a chat template (base and synthetic models)."""
    chat_template: Path | None = None
    """Jinja chat template file used instead of the GGUF's (a base model has none)."""
    shards: int = 3
    """Shards the model's layers are split evenly into."""
    max_tokens: int = 128
    """Tokens to generate at most."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    """How each token is picked."""
    threads: int = 2
    """llama.cpp threads per shard."""
    max_sessions: int = 8
    """Sessions with KV at once per shard."""
    context: int = 2048
    """Positions (prompt plus output) per session."""
    prefill_chunk: int = WorkerConfig.prefill_chunk
    """Tokens per prefill llama_decode call (part of the recipe: chunking fixes numerics)."""
    expert_parallel: int = 0
    """Run a MoE model as an in-process expert-parallel group of this many nodes (each the whole
    backbone and 1/N of the routed experts) instead of layer shards; 0 keeps --shards."""
    repack: bool = True
    """Let llama.cpp repack weights at load (Q4_0 here): it changes Q4_0 results, so compare with
    workers run with the same setting (--no-repack as theirs)."""
    device: DeviceRequest = AUTO
    """Where every shard runs: auto (the build's first GPU, else the CPU), cpu, cuda, metal, vulkan
    or rocm, with an optional index (cuda:1)."""
    gpu_layers: int | None = None
    """On a GPU, offload only this many layers of each shard; none offloads them all."""
    kv_type: KvType = KvType.F16
    """What keys and values are stored as: f16, q8_0 or q4_0 (as the workers' --kv-type)."""

    def llama_config(self, device: DeviceInfo = CPU) -> LlamaConfig:
        return LlamaConfig(
            self.threads,
            self.max_sessions,
            self.context,
            self.prefill_chunk,
            repack=self.repack,
            device=device,
            gpu_layers=self.gpu_layers,
            kv_type=self.kv_type,
        )


@dataclass(frozen=True)
class CertifyArguments:
    """``meshnet certify``: split == whole on this build, on one device."""

    device: DeviceRequest = AUTO
    """The device to certify: auto (the build's first GPU, else the CPU), cpu, cuda, metal, vulkan
    or rocm, with an optional index (cuda:1)."""


@dataclass(frozen=True)
class DevicesArguments:
    """``meshnet devices``: what this build offers and what certification says of each."""

    certify: bool = True
    """Certify each device (a tiny synthetic model, whole vs split); --no-certify only lists them."""


@dataclass(frozen=True)
class BenchOutputs:
    out: Path = Path("bench/results/bench.json")
    """Results JSON."""
    report: Path = Path("bench/report")
    """Folder for report.md and the plots."""


@dataclass(frozen=True)
class StatusArguments:
    """``meshnet status``: nodes, coverage, gaps and load, from a gateway or a tracker."""

    gateway: str = "http://127.0.0.1:8080"
    """Gateway base URL whose /v1/status is shown (also lists live requests)."""
    tracker: str | None = None
    """Ask this tracker (host:port, or its replicas: a:7070,b:7070) directly instead of a gateway."""
    watch: bool = False
    """Redraw every --interval seconds until Ctrl-C."""
    interval: float = 2.0
    """Seconds between redraws with --watch."""
    api_key: str | None = None
    """API key for the gateway's /v1/status (default: DATA_DIR/api-key when it exists)."""
    insecure: bool = False
    """Ask a plaintext (--insecure) tracker; by default --tracker connects as admin of DATA_DIR's swarm."""

    def __post_init__(self) -> None:
        if not self.interval > 0:
            raise InvalidArgument(f"--interval must be > 0, got {self.interval}")
        if self.tracker is not None:
            parse_address_list(self.tracker)


@dataclass(frozen=True)
class GateArguments:
    results: Path = field(metadata=cli(positional=True))
    """Bench results JSON to judge."""
    contract: Path | None = None
    """Performance contract JSON; none uses the packaged v4."""
    inputs: tuple[str, ...] = ()
    """Further results files the contract names, as NAME=PATH (v5: synthetic-3b=..., committed=...)."""


@dataclass(frozen=True)
class LabArguments:
    action: Literal["up", "down", "sweep"] = field(metadata=cli(positional=True))
    """up: build the lab and serve until SIGTERM (then remove it); down: remove what any lab left;
    sweep: one lab per delay x rate point, measured against the physical limit."""
    sweep_output: Path | None = None
    """sweep: results JSON (its plot is written beside it); none: bench/results/lab-sweep.json, or with
    --private 1 (the relayed middle against the direct one) bench/results/lab-sweep-relay.json."""
    sweep_delays_ms: tuple[float, ...] = SWEEP_DELAYS_MS
    """sweep: the one-way delays of the grid (each rate needs its 0 ms point)."""
    sweep_rates_mbit: tuple[float, ...] = SWEEP_RATES_MBIT
    """sweep: the link rates of the grid."""
