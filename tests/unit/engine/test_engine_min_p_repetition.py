"""min-p and the repetition penalty against a straightforward NumPy reference of llama.cpp's chain.

The reference sorts the whole vocabulary and applies each step as llama.cpp's sampler chain
does (logit_bias, repetition penalty, presence / frequency penalties; then top-k, top-p, min-p,
temperature, the seeded draw); the tail's sampler, which orders only what it must, must pick
the same token at every position.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.core.generation import SamplingParams
from meshnet.core.sampling_options import LogitAdjustments
from meshnet.engine.logit_adjustment import adjust_logits
from meshnet.engine.sampling import sample_token
from meshnet.engine.tail_sampler import TailSampler


def _random_logits(seed: int, n_vocab: int = 293) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n_vocab) * 3).astype(np.float32)


def _reference_pick(logits: np.ndarray, params: SamplingParams, position: int) -> int:
    raw = logits.astype(np.float64)
    scaled = raw / params.temperature
    order = np.argsort(-scaled, kind="stable")
    if 0 < params.top_k < len(order):
        order = order[: params.top_k]
    probabilities = np.exp(scaled[order] - scaled[order[0]])
    probabilities /= probabilities.sum()
    if params.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probabilities), params.top_p)) + 1
        order, probabilities = order[:keep], probabilities[:keep] / probabilities[:keep].sum()
    if params.min_p > 0.0:
        # llama.cpp's min-p: p(t) >= min_p * p(best) on the distribution before temperature.
        kept = np.exp(raw[order] - raw.max()) >= params.min_p * (1 - 1e-12)
        order, probabilities = order[kept], probabilities[kept] / probabilities[kept].sum()
    draw = np.random.default_rng((params.seed, position)).random()
    index = min(int(np.searchsorted(np.cumsum(probabilities), draw, side="right")), len(order) - 1)
    return int(order[index])


def _reference_repetition(logits: np.ndarray, penalty: float, seen: set[int]) -> np.ndarray:
    out = logits.astype(np.float32).copy()
    for token in seen:
        out[token] = out[token] / np.float32(penalty) if out[token] > 0 else out[token] * np.float32(penalty)
    return out


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p", "min_p"),
    [
        (1.0, 0, 1.0, 0.05),
        (0.7, 0, 1.0, 0.2),
        (1.5, 0, 0.9, 0.1),
        (1.0, 40, 1.0, 0.1),
        (2.0, 40, 0.8, 0.02),
        (1.0, 0, 0.95, 0.5),
        (0.9, 5, 1.0, 1.0),
    ],
)
def test_min_p_picks_what_the_reference_chain_picks(temperature: float, top_k: int, top_p: float, min_p: float) -> None:
    for seed in range(12):
        logits = _random_logits(seed)
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
        picks = [sample_token(logits, params, position) for position in range(60)]
        assert picks == [_reference_pick(logits, params, position) for position in range(60)]


def test_min_p_drops_what_is_less_likely_than_the_ratio_and_changes_the_draws() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05])).astype(np.float32)
    # 0.05 / 0.5 = 0.1 < 0.2 <= 0.15 / 0.5: only the last token is dropped.
    params = SamplingParams(temperature=1.0, min_p=0.2, seed=3)
    picks = [sample_token(logits, params, position) for position in range(3000)]
    assert set(picks) == {0, 1, 2}
    free = [sample_token(logits, SamplingParams(temperature=1.0, seed=3), position) for position in range(3000)]
    assert 3 in free
    frequencies = np.bincount(picks, minlength=4) / len(picks)
    assert frequencies[:3] == pytest.approx(np.array([0.5, 0.3, 0.15]) / 0.95, abs=0.03)


def test_min_p_one_keeps_only_the_best_and_zero_changes_nothing() -> None:
    for seed in range(20):
        logits = _random_logits(seed)
        best = int(np.argmax(logits))
        assert sample_token(logits, SamplingParams(temperature=5.0, min_p=1.0, seed=seed), 7) == best
        plain = SamplingParams(temperature=1.3, top_p=0.9, seed=seed)
        assert [sample_token(logits, plain, p) for p in range(30)] == [
            _reference_pick(logits, plain, p) for p in range(30)
        ]


def test_min_p_leaves_greedy_alone() -> None:
    logits = _random_logits(4)
    assert sample_token(logits, SamplingParams(min_p=0.9), 0) == int(np.argmax(logits))


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens() -> None:
    logits = np.array([2.0, -1.5, 0.0, 3.0, -0.25], np.float32)
    counts = Counter({0: 2, 1: 1, 2: 1})
    adjusted = adjust_logits(logits, LogitAdjustments(repetition_penalty=1.5), counts)
    np.testing.assert_array_equal(adjusted, _reference_repetition(logits, 1.5, {0, 1, 2}))
    assert adjusted.tolist() == pytest.approx([2.0 / 1.5, -2.25, 0.0, 3.0, -0.25])
    below_one = adjust_logits(logits, LogitAdjustments(repetition_penalty=0.5), counts)
    assert below_one[0] == 4.0 and below_one[1] == -0.75  # < 1 favours repeats
    assert adjust_logits(logits, LogitAdjustments(repetition_penalty=1.5), Counter()).tolist() == logits.tolist()


def test_repetition_comes_after_the_bias_and_before_presence_and_frequency() -> None:
    """llama.cpp's order: logit_bias first, then penalty_repeat, then frequency / presence."""
    logits = np.array([1.0, 0.5, -1.0], np.float32)
    adjustments = LogitAdjustments(
        presence_penalty=0.5, frequency_penalty=0.25, logit_bias=((0, 2.0), (2, 0.5)), repetition_penalty=2.0
    )
    adjusted = adjust_logits(logits, adjustments, Counter({0: 2, 2: 1}))
    assert adjusted[0] == pytest.approx((1.0 + 2.0) / 2.0 - (2 * 0.25 + 0.5))
    assert adjusted[2] == pytest.approx((-1.0 + 0.5) * 2.0 - (0.25 + 0.5))
    assert adjusted[1] == 0.5


def test_repetition_penalty_breaks_a_greedy_loop_at_the_tail() -> None:
    logits = np.array([0.0, 1.0, 0.8], np.float32)
    plain = TailSampler(SamplingParams())
    penalised = TailSampler(SamplingParams(adjustments=LogitAdjustments(repetition_penalty=1.5)))
    assert [plain.choose(logits, p)[0] for p in range(3)] == [1, 1, 1]
    # 1.0 / 1.5 < 0.8 after one pick of token 1; then both were seen: 1/1.5 > 0.8/1.5.
    assert [penalised.choose(logits, p)[0] for p in range(3)] == [1, 2, 1]


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda: SamplingParams(min_p=-0.1), "min_p"),
        (lambda: SamplingParams(min_p=1.01), "min_p"),
        (lambda: SamplingParams(min_p=math.nan), "min_p"),
        (lambda: LogitAdjustments(repetition_penalty=0.0), "repetition_penalty"),
        (lambda: LogitAdjustments(repetition_penalty=-1.0), "repetition_penalty"),
        (lambda: LogitAdjustments(repetition_penalty=math.inf), "repetition_penalty"),
        (lambda: LogitAdjustments(repetition_penalty=101.0), "repetition_penalty"),
    ],
)
def test_out_of_range_values_are_invalid_arguments(build: object, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        build()  # type: ignore[operator]


def test_repetition_penalty_alone_makes_the_adjustments_active() -> None:
    assert LogitAdjustments(repetition_penalty=1.2).active
    assert not LogitAdjustments(repetition_penalty=1.0).active
