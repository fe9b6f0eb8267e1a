"""``meshnet up``'s one typed configuration; its flags are generated from these fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from meshnet.core.config_flags import PROVISIONED_MODEL, cli
from meshnet.core.errors import InvalidArgument
from meshnet.core.kv_type import KvType
from meshnet.node.config import WorkerConfig


@dataclass(frozen=True)
class LocalSwarmConfig:
    """``meshnet up``'s configuration; its flags are generated from these fields."""

    data_dir: Path
    """Slice cache, tracker database and the components' logs."""
    model: Path = field(metadata=cli(shown_default=PROVISIONED_MODEL))
    """Source GGUF every worker cuts its slice from."""
    shards: int = 3
    """Workers to start; the model's layers are split evenly between them."""
    gateway_port: int = field(default=8080, metadata=cli("port"))
    """Port of the OpenAI-compatible gateway."""
    prompt: str = "Write a haiku about machines that share their work."
    """The demo prompt streamed once the swarm is routable."""
    max_tokens: int = 64
    """Tokens the demo answer may take."""
    demo_only: bool = False
    """Stop after the demo answer instead of serving."""
    model_name: str | None = None
    """Name the workers and gateway serve the model under; none: the file's stem."""
    chat_template: Path | None = None
    """Jinja chat template file the gateway uses instead of the GGUF's (as ``meshnet gateway
    --chat-template``): a base model has none, so without one its chat endpoint answers 400 and
    the demo is a plain completion."""
    threads: int = 1
    """llama.cpp threads per worker. Workers share this machine's cores, so one each keeps
    three pipelined shards from competing for two cores."""
    max_in_flight: int | None = None
    """Requests the gateway serves at once; unset: the swarm's session slots."""
    max_queue: int | None = None
    """Requests the gateway queues for a slot (beyond: 503 + Retry-After); unset: 8 per slot."""
    insecure: bool = False
    """Plaintext gRPC between the components instead of mTLS (loopback development only)."""
    expert_parallel: int = 0
    """Serve a MoE model as an expert-parallel group of this many worker processes (each the
    whole backbone and 1/N of the routed experts) instead of layer shards: the demo streams
    through the group driver, then a front worker registers the group with the tracker and the
    gateway serves it. A lost node re-forms the whole group. 0 keeps --shards."""
    expert_cache_mb: float | None = None
    """With --expert-parallel: each node's bound on resident routed experts (MB), streamed from
    the GGUF on a miss; unset keeps them all mapped."""
    repack: bool = True
    """Let llama.cpp repack weights at load (Q4_0 here); part of the recipe, passed to every
    worker, node and front. --no-repack reads them from the mapping, so --expert-cache-mb can
    bound Q4_0 experts."""
    prefix_cache_mb: float = WorkerConfig.prefix_cache_mb
    """Each worker's store of recent prompts' KV, reused by a prompt that starts the same way
    (a conversation's next turn prefills only what is new); 0 turns reuse off."""
    snapshot_every: int = WorkerConfig.snapshot_every
    """Each worker snapshots its sessions' KV every this many positions (a multiple of
    --prefill-chunk; 0: never) under --data-dir, and copies each to a peer of its range if one
    serves: a failover whose new route holds a snapshot of the session on every hop resumes from
    it instead of replaying the whole session."""
    snapshot_disk_mb: float = WorkerConfig.snapshot_disk_mb
    """Disk each worker's snapshots may take (least recently used goes first)."""
    context: int | None = None
    """Positions (prompt plus output) each session holds on every worker (at most the model's
    trained length and 131,072); none: the trained length up to 8,192. Each worker allocates its
    sessions' KV for it at start, so a long context costs memory whether used or not (--kv-type
    q8_0 or q4_0 halves or quarters it)."""
    kv_type: KvType = KvType.F16
    """What every worker stores keys and values as: f16, q8_0 or q4_0 (part of the recipe,
    certified split == whole at each worker's start)."""
    prefill_chunk: int = WorkerConfig.prefill_chunk
    """Tokens per prefill call on every worker (part of the recipe); stored prompt KV is reused in
    whole chunks, so a smaller chunk reuses more of each turn."""

    def __post_init__(self) -> None:
        if self.expert_parallel > 0 and (self.context is not None or self.kv_type is not KvType.F16):
            raise InvalidArgument("--context and --kv-type set layer shards; an expert-parallel group keeps its own")
