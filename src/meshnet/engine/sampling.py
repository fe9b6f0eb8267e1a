"""Token choice at the tail: greedy, or seeded temperature / top-k / top-p.

The random draw for the token that will sit at position ``p`` comes from a generator seeded with
``(seed, p)`` and nothing else, so a sampled run is reproducible, independent of how the prompt
was chunked, and a failover that replays the history onto a replacement shard picks exactly the
tokens the lost shard would have picked.
"""

from __future__ import annotations

import numpy as np

from meshnet.core.generation import SamplingParams


def sample_token(logits: np.ndarray, params: SamplingParams, position: int) -> int:
    """Pick the token for ``position`` from float32 logits [n_vocab]."""
    if params.greedy:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / params.temperature
    candidates = np.arange(scaled.shape[0])
    if 0 < params.top_k < scaled.shape[0]:
        candidates = np.argpartition(-scaled, params.top_k - 1)[: params.top_k]
    # Stable descending order so ties resolve by token id, the same on every machine.
    candidates = candidates[np.argsort(-scaled[candidates], kind="stable")]
    weights = np.exp(scaled[candidates] - scaled[candidates[0]])
    probabilities = weights / weights.sum()
    if params.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probabilities), params.top_p)) + 1
        candidates, probabilities = candidates[:keep], probabilities[:keep] / probabilities[:keep].sum()
    draw = np.random.default_rng((params.seed, position)).random()
    index = min(int(np.searchsorted(np.cumsum(probabilities), draw, side="right")), len(candidates) - 1)
    return int(candidates[index])
