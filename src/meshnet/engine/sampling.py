"""Token choice at the tail: greedy, or seeded temperature / top-k / top-p / min-p.

The truncations follow llama.cpp's sampler chain: top-k, then top-p (on the tempered
probabilities, as this sampler always had it), then min-p, which keeps the tokens whose logit is
within ``ln(min_p)`` of the largest, i.e. on the distribution before temperature. Each keeps a
prefix of the same descending order, so min-p after top-p is the shorter of the two prefixes.

The random draw for the token that will sit at position ``p`` comes from a generator seeded with
``(seed, p)`` and nothing else, so a sampled run is reproducible, independent of how the prompt
was chunked, and a failover that replays the history onto a replacement shard picks exactly the
tokens the lost shard would have picked.
"""

from __future__ import annotations

import math

import numpy as np

from meshnet.core.generation import SamplingParams

LEADING_CANDIDATES = 64
"""Without top_k, only this many leading tokens are ordered; the rest of the vocabulary is sorted
only when the draw (or top_p) reaches past them, which at usual temperatures it almost never does."""


def sample_token(logits: np.ndarray, params: SamplingParams, position: int) -> int:
    """Pick the token for ``position`` from float32 logits [n_vocab]."""
    if params.greedy:
        return int(np.argmax(logits))
    raw = logits.astype(np.float64)
    scaled = raw / params.temperature
    draw = np.random.default_rng((params.seed, position)).random()
    floor = raw.max() + math.log(params.min_p) if params.min_p > 0.0 else -math.inf
    if 0 < params.top_k < scaled.shape[0]:
        candidates = np.argpartition(-scaled, params.top_k - 1)[: params.top_k]
        # Stable descending order so ties resolve by token id, the same on every machine.
        candidates = candidates[np.argsort(-scaled[candidates], kind="stable")]
        weights = np.exp(scaled[candidates] - scaled[candidates[0]])
        return _pick_above(candidates, weights / weights.sum(), raw, floor, params.top_p, draw)
    # weights: [n_vocab]; normalized by their sum in token-id order, so the leading tokens'
    # probabilities (and their running sum) are the same whichever prefix of the order is sorted.
    weights = np.exp(scaled - scaled.max())
    total = weights.sum()
    if params.min_p > 0.0:
        kept = _descending(scaled, np.flatnonzero(raw >= floor))
        return _pick(kept, weights[kept] / total, params.top_p, draw, renormalize=True)
    leading = _descending(scaled, _leading_ids(scaled, LEADING_CANDIDATES))
    picked = _pick_within(leading, weights[leading] / total, params.top_p, draw)
    if picked is not None:
        return picked
    ordered = _descending(scaled, np.arange(scaled.shape[0]))
    return _pick(ordered, weights[ordered] / total, params.top_p, draw)


def _leading_ids(scaled: np.ndarray, count: int) -> np.ndarray:
    """Ids (ascending) of the ``count`` largest values and of every value tied with the last."""
    if count >= scaled.shape[0]:
        return np.arange(scaled.shape[0])
    threshold = np.partition(scaled, scaled.shape[0] - count)[scaled.shape[0] - count]
    return np.flatnonzero(scaled >= threshold)


def _descending(scaled: np.ndarray, ids: np.ndarray) -> np.ndarray:
    # Stable descending order of ascending ids: ties resolve by token id, the same on every machine.
    return ids[np.argsort(-scaled[ids], kind="stable")]


def _pick_within(candidates: np.ndarray, probabilities: np.ndarray, top_p: float, draw: float) -> int | None:
    """The pick when it falls among the leading ``candidates``; None when it may lie beyond them."""
    running = np.cumsum(probabilities)  # a prefix of the running sum over the whole order
    if top_p < 1.0:
        keep = int(np.searchsorted(running, top_p)) + 1
        return _pick(candidates, probabilities, top_p, draw) if keep <= len(candidates) else None
    index = int(np.searchsorted(running, draw, side="right"))
    return int(candidates[index]) if index < len(candidates) else None


def _pick_above(
    candidates: np.ndarray, probabilities: np.ndarray, raw: np.ndarray, floor: float, top_p: float, draw: float
) -> int:
    """The pick among descending ``candidates`` after top-p, keeping only those with a raw logit
    of at least ``floor`` (min-p; the first candidate always qualifies)."""
    kept = int(np.count_nonzero(raw[candidates] >= floor))
    if kept == len(candidates):
        return _pick(candidates, probabilities, top_p, draw)
    return _pick(candidates[:kept], probabilities[:kept], top_p, draw, renormalize=True)


def _pick(
    candidates: np.ndarray, probabilities: np.ndarray, top_p: float, draw: float, renormalize: bool = False
) -> int:
    """``renormalize``: ``probabilities`` are a prefix (min-p's) of a distribution; top-p runs on
    the running sum of the whole one, then what is left is renormalized."""
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probabilities), top_p)) + 1
        candidates, probabilities = candidates[:keep], probabilities[:keep]
        renormalize = True
    if renormalize:
        probabilities = probabilities / probabilities.sum()
    index = min(int(np.searchsorted(np.cumsum(probabilities), draw, side="right")), len(candidates) - 1)
    return int(candidates[index])
