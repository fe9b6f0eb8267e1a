"""Values that describe a generation request and its outcome, shared by client, gateway and engine."""

from __future__ import annotations

from dataclasses import dataclass, field

from meshnet.core.config_flags import cli
from meshnet.core.errors import InvalidArgument
from meshnet.core.sampling_options import LogitAdjustments, LogprobRequest, OutputConstraint

MAX_TOP_K = 1_000_000


@dataclass(frozen=True)
class SamplingParams:
    """How the tail picks each token. ``temperature == 0`` means greedy (argmax)."""

    temperature: float = 0.0
    """Softmax temperature; 0 picks the most likely token (greedy)."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 keeps all."""
    top_p: float = 1.0
    """Keep the smallest set of tokens whose probability reaches top_p."""
    min_p: float = field(default=0.0, metadata=cli(hidden=True))
    """Keep only tokens at least min_p times as likely as the most likely one (llama.cpp's
    min-p: on the logits before temperature, after top-k and top-p); 0 keeps all."""
    seed: int = 0
    """Seeds the sampler so a temperature > 0 run is reproducible."""
    # The OpenAI API's options (the gateway sets them; no command-line flags).
    adjustments: LogitAdjustments = field(default_factory=LogitAdjustments, metadata=cli(hidden=True))
    """logit_bias and presence / frequency penalties, applied before the token is chosen."""
    logprobs: LogprobRequest | None = field(default=None, metadata=cli(hidden=True))
    """Report each token's logprob (and top alternatives); None reports none."""
    constraint: OutputConstraint | None = field(default=None, metadata=cli(hidden=True))
    """A grammar the output must match (JSON mode); None leaves the output free."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 100.0:
            raise InvalidArgument(f"temperature must be in [0, 100], got {self.temperature}")
        if not 0 <= self.top_k <= MAX_TOP_K:
            raise InvalidArgument(f"top_k must be in [0, {MAX_TOP_K}], got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidArgument(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidArgument(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0 <= self.seed < 2**63:
            raise InvalidArgument(f"seed must be in [0, 2**63), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt, already tokenized, to be continued by up to ``max_tokens`` tokens."""

    prompt_tokens: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_tokens: frozenset[int] = frozenset()
    model: str = ""
    """Model name (or recipe fingerprint) to route to; empty means the only model served."""
    timeout_s: float | None = None
    """Whole-request budget; every hop gets what is left of it."""
    cache_salt: str = ""
    """Reuse stored prompt KV only with requests of the same salt (``core.prefix``): a tenant
    whose prompts must not be confirmed by another's timing gives one of its own."""

    def __post_init__(self) -> None:
        if self.timeout_s is not None and not 0 < self.timeout_s <= 86_400:
            raise InvalidArgument(f"timeout must be in (0, 86400] seconds, got {self.timeout_s}")
        if not self.prompt_tokens:
            raise InvalidArgument("the prompt is empty: give at least one token")
        if self.max_tokens < 1:
            raise InvalidArgument(f"max_tokens must be at least 1, got {self.max_tokens}")
        if len(self.cache_salt) > 256:
            raise InvalidArgument("cache_salt must be at most 256 characters")
