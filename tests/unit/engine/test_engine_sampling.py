"""Token choice: greedy is argmax; seeded sampling is reproducible per (seed, position) and
draws from the distribution that temperature, top-k and top-p describe."""

from __future__ import annotations

import math

import numpy as np
import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.core.generation import SamplingParams
from meshnet.engine.sampling import sample_token

PROBABILITIES = np.array([0.5, 0.3, 0.15, 0.05])
LOGITS = np.log(PROBABILITIES).astype(np.float32) + 3.0  # a shift must not matter
DRAWS = 4000


def _random_logits(seed: int, n_vocab: int = 293) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n_vocab) * 3).astype(np.float32)


def _frequencies(params: SamplingParams, logits: np.ndarray = LOGITS) -> np.ndarray:
    """How often each token is drawn over DRAWS consecutive positions."""
    counts = np.bincount([sample_token(logits, params, position) for position in range(DRAWS)], minlength=len(logits))
    return counts / DRAWS


def test_greedy_is_argmax() -> None:
    for seed in range(50):
        logits = _random_logits(seed)
        assert sample_token(logits, SamplingParams(), seed) == int(np.argmax(logits))
    tied = np.array([0.0, 2.0, 2.0, 1.0], np.float32)
    assert sample_token(tied, SamplingParams(), 0) == 1  # ties go to the lower id


def test_greedy_ignores_seed_and_position() -> None:
    logits = _random_logits(1)
    picks = {sample_token(logits, SamplingParams(seed=s), p) for s in range(5) for p in range(5)}
    assert picks == {int(np.argmax(logits))}


def test_seeded_sampling_is_reproducible_per_seed_and_position() -> None:
    logits = _random_logits(2) / 3
    params = SamplingParams(temperature=1.0, seed=1234)
    first = [sample_token(logits, params, position) for position in range(200)]
    assert first == [sample_token(logits.copy(), params, position) for position in range(200)]
    assert len(set(first)) > 20  # positions draw independently, not one token repeated
    other_seed = [sample_token(logits, SamplingParams(temperature=1.0, seed=1235), p) for p in range(200)]
    assert other_seed != first
    # Position p's draw does not depend on which positions were drawn before it.
    assert [sample_token(logits, params, p) for p in range(199, -1, -1)] == first[::-1]


@pytest.mark.parametrize("temperature", [0.3, 1.0, 5.0])
def test_top_k_one_is_greedy(temperature: float) -> None:
    for seed in range(40):
        logits = _random_logits(seed)
        params = SamplingParams(temperature=temperature, top_k=1, seed=seed)
        assert sample_token(logits, params, seed) == int(np.argmax(logits))


@pytest.mark.parametrize("top_p", [1e-9, 0.01])
def test_tiny_top_p_is_greedy(top_p: float) -> None:
    for seed in range(40):
        logits = _random_logits(seed)
        params = SamplingParams(temperature=2.0, top_p=top_p, seed=seed)
        assert sample_token(logits, params, seed) == int(np.argmax(logits))


def test_frequencies_follow_the_softmax_at_temperature_one() -> None:
    observed = _frequencies(SamplingParams(temperature=1.0, seed=7))
    # 4000 draws: the standard error is at most 0.008; 0.03 is almost 4 of them.
    assert np.abs(observed - PROBABILITIES).max() < 0.03, observed


def test_temperature_flattens_and_sharpens() -> None:
    for temperature in (0.5, 2.0):
        expected = PROBABILITIES ** (1 / temperature)
        expected /= expected.sum()
        observed = _frequencies(SamplingParams(temperature=temperature, seed=8))
        assert np.abs(observed - expected).max() < 0.03, (temperature, observed)


def test_top_k_keeps_the_k_most_likely() -> None:
    observed = _frequencies(SamplingParams(temperature=1.0, top_k=2, seed=9))
    assert observed[2] == observed[3] == 0.0
    assert abs(observed[0] - 0.5 / 0.8) < 0.03, observed


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    observed = _frequencies(SamplingParams(temperature=1.0, top_p=0.7, seed=10))  # {0, 1} holds 0.8
    assert observed[2] == observed[3] == 0.0
    assert abs(observed[0] - 0.5 / 0.8) < 0.03, observed
    observed = _frequencies(SamplingParams(temperature=1.0, top_p=0.9, seed=10))  # {0, 1, 2} holds 0.95
    assert observed[3] == 0.0 and observed[2] > 0.1


def test_large_logits_do_not_overflow() -> None:
    logits = np.array([1e4, 1e4 - 1, -1e4], np.float32)
    picks = {sample_token(logits, SamplingParams(temperature=0.5, seed=s), 0) for s in range(200)}
    assert picks == {0, 1}


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": -0.1},
        {"temperature": 100.5},
        {"temperature": math.nan},
        {"temperature": math.inf},
        {"top_k": -1},
        {"top_k": 1_000_001},
        {"top_p": 0.0},
        {"top_p": -0.5},
        {"top_p": 1.01},
        {"top_p": math.nan},
        {"seed": -1},
        {"seed": 2**63},
    ],
    ids=str,
)
def test_invalid_sampling_params_are_invalid_argument(fields: dict[str, float]) -> None:
    with pytest.raises(InvalidArgument):
        SamplingParams(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("temperature", "top_p"), [(0.3, 1.0), (0.7, 0.9), (1.0, 1.0), (5.0, 1.0), (5.0, 0.99)])
def test_ordering_only_the_leading_tokens_picks_what_ordering_all_of_them_does(
    temperature: float, top_p: float
) -> None:
    """Without top_k the sampler orders only the leading tokens (and the whole vocabulary only
    when the draw reaches past them); every pick equals the one over the fully sorted order."""
    rng = np.random.default_rng(11)
    for position in range(60):
        logits = (rng.standard_normal(5000) * 4).astype(np.float32)
        params = SamplingParams(temperature=temperature, top_p=top_p, seed=5)
        scaled = logits.astype(np.float64) / temperature
        ordered = np.argsort(-scaled, kind="stable")
        weights = np.exp(scaled - scaled.max())
        probabilities = weights[ordered] / weights.sum()
        if top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probabilities), top_p)) + 1
            ordered, probabilities = ordered[:keep], probabilities[:keep] / probabilities[:keep].sum()
        draw = np.random.default_rng((5, position)).random()
        index = min(int(np.searchsorted(np.cumsum(probabilities), draw, side="right")), len(ordered) - 1)
        assert sample_token(logits, params, position) == int(ordered[index])
