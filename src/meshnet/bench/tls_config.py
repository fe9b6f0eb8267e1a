"""``meshnet bench-tls``'s configuration, apart from the measurement so the CLI parser stays light."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from meshnet.core.config_flags import PROVISIONED_MODEL, cli


@dataclass(frozen=True)
class TlsCostConfig:
    """``meshnet bench-tls``: the cost of mTLS on the meshnet-N lane."""

    data_dir: Path
    """Slice cache, logs and the swarm CA the workers' identities are minted from."""
    model: Path = field(metadata=cli(shown_default=PROVISIONED_MODEL))
    """Source GGUF the workers serve."""
    shards: int = 3
    """Workers in the route (meshnet-N)."""
    tokens: int = 48
    """Greedy tokens per measured request."""
    rounds: int = 2
    """Rounds per variant, alternating which goes first."""
    probe_tokens: int = 16
    """Decode steps of the per-link latency probe."""
    threads: int = 1
    """llama.cpp threads per worker."""
    start_timeout_s: float = field(default=180.0, metadata=cli("start-timeout"))
    """Seconds the workers of one round may take to be ready."""
    out: Path = Path("bench-tls.json")
    """Where the JSON result is written."""
