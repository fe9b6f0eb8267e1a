"""OpenAI's ``logit_bias``, the repetition penalty and presence / frequency penalties over a tail's
logits, in llama.cpp's order (bias, then repetition, then presence / frequency).

The penalties count the tokens generated so far in this completion (not the prompt), as OpenAI
and vLLM do; the tail keeps the counts per session (``TailSampler``), and a failover replay
rebuilds them because the replacement tail re-samples every replayed token.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from meshnet.core.errors import InvalidArgument
from meshnet.core.sampling_options import LogitAdjustments


def adjust_logits(logits: np.ndarray, adjustments: LogitAdjustments, counts: Mapping[int, int]) -> np.ndarray:
    """A float32 copy of ``logits`` [n_vocab] with the bias added and the penalties taken off."""
    adjusted = np.array(logits, dtype=np.float32, copy=True)
    n_vocab = adjusted.shape[0]
    for token, bias in adjustments.logit_bias:
        if token >= n_vocab:
            raise InvalidArgument(f"logit_bias names token {token}; this model's vocabulary has {n_vocab}")
        adjusted[token] += np.float32(bias)
    if counts and adjustments.repetition_penalty != 1.0:
        seen_ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        factor = np.float32(adjustments.repetition_penalty)
        values = adjusted[seen_ids]
        adjusted[seen_ids] = np.where(values > 0, values / factor, values * factor)
    if counts and (adjustments.presence_penalty or adjustments.frequency_penalty):
        tokens = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        seen = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
        penalty = seen * adjustments.frequency_penalty + adjustments.presence_penalty
        adjusted[tokens] -= penalty.astype(np.float32)
    return adjusted
