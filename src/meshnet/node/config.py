"""The worker's one typed configuration; ``meshnet worker``'s flags are generated from it.

The engine's ``LlamaConfig`` and the session table's ``AdmissionPolicy`` are derived from it
(``llama_config``, ``admission_policy``), never declared again with defaults of their own.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from meshnet.core.addresses import TrackerOrder, check_advertise_address, parse_address_list
from meshnet.core.config_flags import PROVISIONED_MODEL, cli
from meshnet.core.devices import AUTO, CPU, DeviceInfo, DeviceRequest
from meshnet.core.errors import InvalidArgument
from meshnet.core.kv_type import KvType
from meshnet.core.layer_costs import WorkerLoad
from meshnet.core.layers import LayerRange
from meshnet.core.limits import MAX_FRAME_BYTES
from meshnet.core.reachability import DeclaredReachability
from meshnet.engine.llama_config import LlamaConfig
from meshnet.moe.ownership import ExpertOwnership
from meshnet.session.admission import AdmissionPolicy, PeerBounds


@dataclass(frozen=True)
class FakeModel:
    """Serve deterministic arithmetic instead of a model (protocol and integration tests)."""

    n_layers: int = field(default=6, metadata=cli("layers"))
    """Serve a fake model of this many layers instead of a GGUF (tests)."""
    n_embd: int = 16
    """Width of the fake hidden state."""
    n_vocab: int = 64
    """Vocabulary size of the fake model's logits."""
    step_delay: float = 0.0
    """Seconds each engine batch sleeps, to make timing-dependent tests observable."""


@dataclass(frozen=True)
class LayerChoice:
    """What ``--layers`` says: a fixed range ``A:B`` (B exclusive), or ``auto``: ask the tracker
    which range the swarm needs most within ``--memory-budget-mb``."""

    fixed: LayerRange | None

    @classmethod
    def parse(cls, text: str) -> LayerChoice:
        return cls(None) if text.strip() == "auto" else cls(LayerRange.parse(text))

    def __str__(self) -> str:
        return "auto" if self.fixed is None else str(self.fixed)


@dataclass(frozen=True)
class WorkerConfig:
    model: Path | None = field(metadata=cli(shown_default=PROVISIONED_MODEL))
    """Source GGUF; the worker cuts (or reuses) the slice for its layers from it."""
    layer_choice: LayerChoice = field(metadata=cli("layers", shown_default="required unless --experts"))
    """Layers this worker serves, A:B half-open (B exclusive), or auto (needs --tracker and
    --memory-budget-mb): the range the swarm needs most that fits the budget."""
    data_dir: Path
    """Holds the slice cache."""
    model_name: str | None = None
    """Name served to clients; none: the published name (--model-id), else the file's stem."""
    host: str = "127.0.0.1"
    """Bind address: loopback unless told otherwise, so a bare worker is never exposed."""
    port: int = 0
    """Port to listen on; 0 picks a free port (printed on start)."""
    advertise: str | None = None
    """Address (host:port) other shards and clients use; none uses host:port as bound."""
    tracker: str | None = None
    """Tracker address (host:port) to register and heartbeat with, or its replicas
    (a:7070,b:7070: the worker moves to the next when one is lost); none runs it standalone."""
    tracker_order: TrackerOrder = "spread"
    """Order the worker asks --tracker replicas in: spread (its own, ranked by its node id, so
    workers spread over the replicas) or listed (first listed first: trackers sharing no store)."""
    reachability: DeclaredReachability = "auto"
    """Whether peers can dial --advertise: auto (the tracker dials it back and says), public, or
    private (behind a home router or NAT: reached only through a --relay, else listed but not routed)."""
    relay: tuple[str, ...] = ()
    """Relays (host:port, in order) a private worker keeps one outbound link to and is reached
    through (registered as NODE_ID@RELAY); on losing one it moves to the next. With --reachability
    auto they are used once the tracker finds --advertise unreachable."""
    threads: int = 2
    """llama.cpp threads for this shard's decode and prefill."""
    device: DeviceRequest = AUTO
    """Where the layers run: auto (the build's first GPU, else the CPU), cpu, cuda, metal, vulkan
    or rocm, with an optional index (cuda:1). Part of the recipe: a GPU's kernels compute other
    numbers than the CPU's, so routes chain only shards of one device class."""
    gpu_layers: int | None = None
    """On a GPU, offload only this many of the range's layers (the rest run on the CPU) when
    device memory is short; none offloads them all."""
    max_sessions: int = 8
    """Sessions holding KV at once (llama sequences); cut to fit memory_budget_mb."""
    memory_budget_mb: float | None = None
    """Resident memory this worker may use, all of it (runtime, weights, KV, scratch; a head's
    token table, a tail's LM head and vocabulary); max_sessions is cut to fit it."""
    n_ctx_per_session: int = field(default=2048, metadata=cli("context"))
    """Positions (prompt plus output) each session may hold."""
    prefill_chunk: int = 64
    """Tokens per prefill llama_decode call. Part of the recipe: chunking fixes numerics, and
    stored prompt KV is reused in whole chunks, so a smaller chunk reuses more of each turn (64
    leaves half as many tokens to prefill again per turn as 128; on 2 CPU threads it prefills a
    cold prompt 11-17% slower than 256). A GPU wants larger calls: give it 256 or 512."""
    prefix_cache_mb: float = 256.0
    """KV of recent prompts' chunk-aligned prefixes kept to reuse (least recently used goes
    first): a prompt that starts the same way prefills only the rest. Counted in
    --memory-budget-mb; 0 turns reuse off."""
    snapshot_every: int = 0
    """Snapshot each session's KV every this many positions (a multiple of --prefill-chunk; 0:
    never), to this worker's disk: a failover onto a route whose hops all hold a snapshot of the
    session resumes from it instead of replaying the session from its first token."""
    snapshot_disk_mb: float = 1024.0
    """Disk the snapshots may take under --data-dir (least recently used goes first)."""
    flash_attn: bool = True
    """Flash attention; part of the recipe. It keeps batched sessions bit-identical to solo ones."""
    kv_type: KvType = KvType.F16
    """What keys and values are stored as: f16, q8_0 (about half of f16's memory) or q4_0 (about
    a quarter). Part of the recipe (a route never mixes KV types) and certified split == whole
    at start-up; q8_0 and q4_0 need flash attention."""
    mmap: bool = True
    """Map the slice's weights from its file; --no-mmap copies them into the process, so a
    memory cap counts them (mapped pages are reclaimable and would always "fit")."""
    repack: bool = True
    """Let llama.cpp repack weights at load for its CPU kernels (Q4_0 here); part of the recipe
    (it changes Q4_0 results). --no-repack reads them from the model's mapping, so that
    --expert-cache-mb can bound Q4_0 experts."""
    max_frame_bytes: int = MAX_FRAME_BYTES
    """Largest gRPC message this worker sends or accepts."""
    max_queue: int = 64
    """Queued steps across all sessions beyond which new sessions are refused."""
    evict_idle_after: float = 30.0
    """Seconds without a step after which a session may be evicted for a newcomer."""
    session_ttl: float = 600.0
    """Seconds without a step after which a session is expired even without pressure."""
    session_share: float = 0.5
    """Share of this shard's sessions one peer certificate may hold once the shard is full: at
    that bound it is refused, and a peer under it may take a slot back from one over it. While
    slots are free anyone takes them, so a lone gateway or upstream worker fills the shard."""
    session_min_rate: float = 0.5
    """Positions per second a session must average (after --session-grace) to keep its slot
    when a newcomer needs it: a trickle of steps cannot hold a slot for ever."""
    session_grace: float = 60.0
    """Seconds every session may hold its slot whatever its progress."""
    metrics_port: int | None = None
    """Serve Prometheus /metrics on this port (0 picks one); none serves none."""
    model_id: str | None = None
    """Fetch this layer range by model id from the holders the tracker names (no local GGUF needed)."""
    trust_publisher: str | None = None
    """With --model-id: accept only manifests this key fingerprint signed; none trusts the first key seen."""
    fake: FakeModel | None = None
    """When set, no model is loaded (``model`` is ignored)."""
    drain_grace: float = 20.0
    """Seconds in-flight sessions get to finish after SIGTERM before they are released."""
    experts: ExpertOwnership | None = None
    """Serve the whole model as node I of an N-node expert-parallel group (I/N): routed experts
    e mod N == I computed here, slot rows swapped with --expert-peers. Replaces --layers."""
    expert_peers: tuple[str, ...] = ()
    """With --experts: every node's host:port in index order (this node's own included); as
    NODE_ID@host:port, only that node's certificate may serve or send that index's rows."""
    expert_timeout: float = 10.0
    """With --experts: seconds to wait for a peer's rows of one layer before the step fails."""
    expert_cache_mb: float | None = None
    """With --experts: bound the routed experts resident on this node to this many MB, streamed
    from the GGUF on a miss (LRU); unset keeps them all mapped (the page cache decides)."""
    expert_group: tuple[str, ...] = ()
    """Serve the expert-parallel group at these node addresses (host:port, index order) as one
    full-range shard: registers with --tracker like any worker, loads no weights itself (it
    reads --model's header and hash). --layers defaults to the whole model; sessions and context
    are the nodes' (their --max-sessions, --context), --prefill-chunk, --flash-attn and --repack must be."""

    def __post_init__(self) -> None:
        if isinstance(self.layer_choice, LayerRange):  # callers that predate ``auto``
            object.__setattr__(self, "layer_choice", LayerChoice(self.layer_choice))
        if self.layer_choice.fixed is None and (self.tracker is None or self.memory_budget_mb is None):
            raise InvalidArgument("--layers auto asks the tracker within a budget: give --tracker, --memory-budget-mb")
        if self.advertise is not None:
            check_advertise_address(self.advertise, flag="--advertise")
        if self.tracker is not None:
            parse_address_list(self.tracker)
        for relay in self.relay:
            check_advertise_address(relay, flag="--relay")
        if self.relay and (self.reachability == "public" or self.tracker is None):
            raise InvalidArgument(
                "--relay is for a private worker that registers with a tracker: give --tracker, "
                "and --reachability private or auto"
            )
        if not 0 <= self.port <= 65535:
            raise InvalidArgument(f"worker config: port must be in [0, 65535], got {self.port}")
        if self.model is None and self.fake is None and self.model_id is None:
            raise InvalidArgument("a worker needs --model or --model-id (or a fake model)")
        if self.model_id is not None and self.tracker is None:
            raise InvalidArgument("a worker started with --model-id needs --tracker to find the model's holders")
        if not 0 < self.session_share <= 1 or self.session_min_rate <= 0 or self.session_grace < 0:
            raise InvalidArgument("--session-share takes (0, 1], --session-min-rate > 0, --session-grace >= 0")
        if self.expert_cache_mb is not None and (self.experts is None or self.expert_cache_mb <= 0):
            raise InvalidArgument("--expert-cache-mb takes a positive size, on an expert-parallel node (--experts I/N)")
        if self.prefix_cache_mb < 0:
            raise InvalidArgument(
                f"--prefix-cache-mb takes a size in MB (0 turns reuse off), got {self.prefix_cache_mb}"
            )
        if self.snapshot_every < 0 or self.snapshot_every % self.prefill_chunk or self.snapshot_disk_mb < 0:
            raise InvalidArgument(
                f"--snapshot-every takes a multiple of --prefill-chunk ({self.prefill_chunk}; 0 takes none), got "
                f"{self.snapshot_every}; --snapshot-disk-mb a size in MB, got {self.snapshot_disk_mb}"
            )
        if self.kv_type.quantized and (not self.flash_attn or self.experts is not None or self.expert_group):
            raise InvalidArgument(
                f"--kv-type {self.kv_type} needs flash attention (drop --no-flash-attn) and a layer-range "
                "worker (expert-parallel nodes keep f16 KV)"
            )
        if self.gpu_layers is not None and self.gpu_layers < 0:
            raise InvalidArgument(f"--gpu-layers takes a count of layers (0 or more), got {self.gpu_layers}")
        if self.expert_group and (
            self.experts is not None or self.fake is not None or self.model is None or self.model_id is not None
        ):
            raise InvalidArgument("--expert-group fronts a group of --model: drop --experts, --fake, --model-id")

    @property
    def layers(self) -> LayerRange:
        """The range served; ``auto`` is resolved (``auto_layers.resolve_layers``) before start."""
        if self.layer_choice.fixed is None:
            raise InvalidArgument("--layers auto must be resolved with the tracker before the worker starts")
        return self.layer_choice.fixed

    def llama_config(self, max_sessions: int, device: DeviceInfo = CPU) -> LlamaConfig:
        """The engine's settings; ``max_sessions`` is the capacity plan's (cut to the memory budget)
        and ``device`` what ``device`` resolved to on this build (``engine.devices.find_device``)."""
        return LlamaConfig(
            n_threads=self.threads,
            max_slots=max_sessions,
            n_ctx_per_slot=self.n_ctx_per_session,
            max_batch_tokens=self.prefill_chunk,
            flash_attn=self.flash_attn,
            use_mmap=self.mmap,
            repack=self.repack,
            device=device,
            gpu_layers=self.gpu_layers,
            kv_type=self.kv_type,
        )

    def memory_load(self) -> WorkerLoad:
        """What this worker holds besides its layers, for the memory cost model (``core.layer_costs``)."""
        return WorkerLoad(self.max_sessions, self.n_ctx_per_session, self.prefill_chunk, self.kv_type)

    def memory_budget_bytes(self) -> int | None:
        return None if self.memory_budget_mb is None else int(self.memory_budget_mb * 2**20)

    @property
    def prefix_cache_bytes(self) -> int:
        """The reuse store's budget; an expert group keeps no KV of its own (its nodes do)."""
        return 0 if self.expert_group else int(self.prefix_cache_mb * 2**20)

    def snapshot_directory(self, node_id: str) -> Path:
        """Where this worker's snapshots live: its own folder, which no other process shares."""
        return self.data_dir / "snapshots" / hashlib.sha256(node_id.encode()).hexdigest()[:16]

    @property
    def snapshot_bytes(self) -> int:
        """The snapshot disk's budget; none where no snapshot is ever taken."""
        return 0 if self.expert_group or not self.snapshot_every else int(self.snapshot_disk_mb * 2**20)

    def admission_policy(self, max_sessions: int) -> AdmissionPolicy:
        """Admission for the session table, with the capacity plan's session count."""
        peers = PeerBounds(self.session_share, self.session_min_rate, self.session_grace)
        return AdmissionPolicy(max_sessions, self.max_queue, self.evict_idle_after, self.session_ttl, peers)
