"""Log-probabilities of a tail's logits, as OpenAI's ``logprobs`` / ``top_logprobs`` report them.

They are the model's own distribution: ``log_softmax`` of the raw logits, before temperature,
penalties, ``logit_bias`` or a grammar change the choice (what vLLM reports by default). Computed
in float64 and rounded to float32 with a fixed order of operations, so the same logits give the
same bits on every split of the model.
"""

from __future__ import annotations

import numpy as np

from meshnet.core.sampling_options import LogprobRequest, TokenLogprob, TokenLogprobs


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 [n_vocab] log-probabilities of float32 logits [n_vocab]."""
    wide = logits.astype(np.float64)
    shifted = wide - wide.max()
    return shifted - np.log(np.exp(shifted).sum())


def token_logprobs(logits: np.ndarray, token: int, request: LogprobRequest) -> TokenLogprobs:
    """The chosen ``token``'s logprob and the ``request.top`` most likely tokens'."""
    logprobs = log_softmax(logits)
    top: tuple[TokenLogprob, ...] = ()
    if request.top > 0:
        count = min(request.top, logprobs.shape[0])
        candidates = np.argpartition(-logprobs, count - 1)[:count]
        # Most likely first; ties by lower id (lexsort's last key is the primary one).
        ordered = candidates[np.lexsort((candidates, -logprobs[candidates]))]
        top = tuple(_entry(logprobs, int(t)) for t in ordered)
    return TokenLogprobs(_entry(logprobs, token), top)


def _entry(logprobs: np.ndarray, token: int) -> TokenLogprob:
    # float32 on the wire; min(...) keeps a rounding of log(1) from landing above zero.
    return TokenLogprob(token, min(float(np.float32(logprobs[token])), 0.0))
