"""The OpenAI-style sampling options beyond temperature / top-k / top-p, and what they return.

Each is its own small frozen value nested in ``SamplingParams`` (never one flag per feature on the
request): logit adjustments (``logit_bias``, presence and frequency penalties), a logprob request
(how many alternatives per token), and an output constraint (a GBNF grammar the text must match).
They are applied at the tail, from its logits, so they mean the same on every split of the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshnet.core.errors import InvalidArgument

MAX_TOP_LOGPROBS = 20
"""OpenAI's limit on ``top_logprobs``."""
MAX_LOGIT_BIAS_ENTRIES = 300
"""OpenAI's limit on ``logit_bias`` entries; it also bounds what the opening frame carries."""
MAX_GRAMMAR_CHARS = 32 * 1024
"""A grammar travels in the opening frame, whose non-payload room is 64 KiB."""
MAX_TOKEN_ID = 2**31 - 1
MAX_REPETITION_PENALTY = 100.0
"""A finite bound: beyond it every seen token is already as good as forbidden."""


@dataclass(frozen=True)
class LogitAdjustments:
    """Changes to the logits before a token is chosen, as OpenAI defines them.

    In llama.cpp's order: ``logit[t] += bias[t]``; then for every ``t`` with ``count[t] > 0``
    the repetition penalty (a positive logit divided by it, a negative one multiplied, as vLLM,
    Hugging Face and llama.cpp's ``penalty_repeat`` do); then
    ``logit[t] -= count[t] * frequency_penalty + (count[t] > 0) * presence_penalty``, where
    ``count[t]`` is how often ``t`` was generated so far in this completion (the prompt is not
    counted: the tail never sees its tokens).
    """

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias in [-100, 100]) pairs, sorted by token id, each id at most once."""
    repetition_penalty: float = 1.0
    """In (0, MAX_REPETITION_PENALTY]; 1 is off, above 1 discourages repeats."""

    def __post_init__(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and -2.0 <= value <= 2.0):
                raise InvalidArgument(f"{name} must be in [-2, 2], got {value}")
        if not (math.isfinite(self.repetition_penalty) and 0.0 < self.repetition_penalty <= MAX_REPETITION_PENALTY):
            raise InvalidArgument(
                f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY:g}], got {self.repetition_penalty}"
            )
        if len(self.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
            raise InvalidArgument(f"logit_bias holds {len(self.logit_bias)} entries; at most {MAX_LOGIT_BIAS_ENTRIES}")
        ids = [token for token, _ in self.logit_bias]
        if ids != sorted(set(ids)):
            raise InvalidArgument("logit_bias entries must be sorted by token id, each id once")
        for token, bias in self.logit_bias:
            if not 0 <= token <= MAX_TOKEN_ID:
                raise InvalidArgument(f"logit_bias token id {token} is not a token id")
            if not (math.isfinite(bias) and -100.0 <= bias <= 100.0):
                raise InvalidArgument(f"logit_bias for token {token} must be in [-100, 100], got {bias}")

    @property
    def active(self) -> bool:
        return bool(
            self.presence_penalty or self.frequency_penalty or self.logit_bias or self.repetition_penalty != 1.0
        )


@dataclass(frozen=True)
class LogprobRequest:
    """Report the chosen token's log-probability and the ``top`` most likely alternatives."""

    top: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.top <= MAX_TOP_LOGPROBS:
            raise InvalidArgument(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top}")


MAX_TRIGGERS = 8
MAX_TRIGGER_CHARS = 128


@dataclass(frozen=True)
class OutputConstraint:
    """The generated text must match this GBNF grammar (llama.cpp's grammar format)."""

    grammar: str
    root: str = "root"
    triggers: tuple[str, ...] = ()
    """A lazy grammar (``tool_choice: auto``): free text until one of these words is generated,
    then the grammar holds from the word's first character on. Empty: it holds from the start."""

    def __post_init__(self) -> None:
        if not self.grammar or len(self.grammar) > MAX_GRAMMAR_CHARS:
            raise InvalidArgument(f"a grammar must be 1 to {MAX_GRAMMAR_CHARS} characters, got {len(self.grammar)}")
        if not self.root or len(self.root) > 128:
            raise InvalidArgument("a grammar's root rule name must be 1 to 128 characters")
        if len(self.triggers) > MAX_TRIGGERS:
            raise InvalidArgument(f"a grammar has at most {MAX_TRIGGERS} trigger words, got {len(self.triggers)}")
        if any(not 1 <= len(word) <= MAX_TRIGGER_CHARS for word in self.triggers):
            raise InvalidArgument(f"a grammar's trigger words must be 1 to {MAX_TRIGGER_CHARS} characters")


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    """Natural log of the token's probability under the model (float32 precision)."""


@dataclass(frozen=True)
class TokenLogprobs:
    """What the tail reports for one sampled token when logprobs were asked for."""

    chosen: TokenLogprob
    top: tuple[TokenLogprob, ...] = ()
    """The most likely tokens, most likely first (ties by lower id)."""

    def __post_init__(self) -> None:
        if len(self.top) > MAX_TOP_LOGPROBS:
            raise InvalidArgument(f"at most {MAX_TOP_LOGPROBS} top logprobs, got {len(self.top)}")
        for entry in (self.chosen, *self.top):
            if not 0 <= entry.token_id <= MAX_TOKEN_ID:
                raise InvalidArgument(f"logprob token id {entry.token_id} is not a token id")
            if math.isnan(entry.logprob) or entry.logprob > 0.0:
                raise InvalidArgument(f"a logprob must be <= 0, got {entry.logprob}")
