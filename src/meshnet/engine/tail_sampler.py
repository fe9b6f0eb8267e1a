"""One session's token choice at the tail: its sampling parameters and what it generated so far.

The order is OpenAI's and llama.cpp's: adjust the logits (``logit_bias``, penalties over the
tokens generated so far), mask what the grammar forbids, then choose (``sampling.sample_token``:
greedy or the seeded draw for this position). Logprobs are the model's own (``logprobs.py``).
Everything a session accumulates comes from the tokens it chose, in order, so a failover replay,
which re-samples each replayed token on the replacement tail, rebuilds exactly the same state.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from meshnet.core.generation import SamplingParams
from meshnet.core.sampling_options import TokenLogprobs
from meshnet.engine.constraints import GrammarMatcher
from meshnet.engine.logit_adjustment import adjust_logits
from meshnet.engine.logprobs import token_logprobs
from meshnet.engine.sampling import sample_token


class TailSampler:
    """Chooses each token of one session; owns its grammar matcher (``close`` frees it)."""

    def __init__(self, params: SamplingParams, matcher: GrammarMatcher | None = None) -> None:
        self.params = params
        self._matcher = matcher
        self._counts: Counter[int] = Counter()

    def choose(self, logits: np.ndarray, position: int) -> tuple[int, TokenLogprobs | None]:
        """The token for ``position`` from float32 logits [n_vocab], and its logprobs if asked for."""
        params = self.params
        adjusted = adjust_logits(logits, params.adjustments, self._counts) if params.adjustments.active else logits
        token = self._pick(adjusted, position)
        logprobs = None if params.logprobs is None else token_logprobs(logits, token, params.logprobs)
        self._counts[token] += 1
        if self._matcher is not None:
            self._matcher.accept(token)
        return token, logprobs

    def advance(self, tokens: tuple[int, ...]) -> None:
        """Take ``tokens`` as chosen already (a session resumed past them): the state choosing
        them would leave, without sampling."""
        for token in tokens:
            self._counts[token] += 1
            if self._matcher is not None:
                self._matcher.accept(token)

    def _pick(self, logits: np.ndarray, position: int) -> int:
        matcher = self._matcher
        if matcher is None:
            return sample_token(logits, self.params, position)
        if self.params.greedy:
            # The argmax, if the grammar allows it, is the argmax of the masked logits too, so
            # checking one candidate saves masking the whole vocabulary on most steps.
            first = sample_token(logits, self.params, position)
            if matcher.allows(first):
                return first
        return sample_token(matcher.mask(logits), self.params, position)

    def close(self) -> None:
        if self._matcher is not None:
            self._matcher.close()
