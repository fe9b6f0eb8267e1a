"""The worker's one typed configuration; CLI flags are generated from it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from meshnet.core.layers import LayerRange


@dataclass(frozen=True)
class FakeModel:
    """Serve deterministic arithmetic instead of a model (protocol and integration tests)."""

    n_layers: int = 6
    n_embd: int = 16
    n_vocab: int = 64
    step_delay: float = 0.0
    """Seconds each engine batch sleeps, to make timing-dependent tests observable."""


@dataclass(frozen=True)
class WorkerConfig:
    model: Path | None
    """Source GGUF; the worker cuts (or reuses) the slice for its layers from it."""
    layers: LayerRange
    data_dir: Path
    """Holds the slice cache."""
    model_name: str | None = None
    """Name served to clients; defaults to the GGUF's general.name."""
    host: str = "127.0.0.1"
    """Bind address: loopback unless told otherwise, so a bare worker is never exposed."""
    port: int = 0
    """0 picks a free port (printed on start)."""
    advertise: str | None = None
    """Address other shards and clients use; defaults to host:port."""
    tracker: str | None = None
    """Tracker address to register and heartbeat with; none runs the worker standalone."""
    threads: int = 2
    max_sessions: int = 8
    memory_budget_mb: float | None = None
    """Memory this shard may use for weights, KV and scratch; max_sessions is cut to fit it."""
    n_ctx_per_session: int = 2048
    prefill_chunk: int = 256
    """Tokens per prefill llama_decode call. Part of the recipe: chunking fixes numerics."""
    flash_attn: bool = True
    max_frame_bytes: int = 4 * 1024 * 1024
    max_queue: int = 64
    evict_idle_after: float = 30.0
    session_ttl: float = 600.0
    metrics_port: int | None = None
    """Serve Prometheus ``/metrics`` on this port (0 picks one); None serves none."""
    fake: FakeModel | None = None
    """When set, no model is loaded (``model`` is ignored)."""
    drain_grace: float = 20.0
    """Seconds in-flight sessions get to finish after SIGTERM before they are released."""
