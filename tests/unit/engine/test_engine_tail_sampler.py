"""The tail's OpenAI options over real logits arrays: logprobs, penalties, logit_bias, grammars.

The grammar tests use llama.cpp's own grammar sampler on the vocabulary of a synthetic GGUF
(byte tokens, so any JSON is spellable) and decode the chosen tokens with the real tokenizer.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import write_synthetic_model
from meshnet.core.errors import InvalidArgument
from meshnet.core.generation import SamplingParams
from meshnet.core.sampling_options import LogitAdjustments, LogprobRequest
from meshnet.engine.constraints import (
    GrammarVocabulary,
    json_object_constraint,
    json_schema_constraint,
)
from meshnet.engine.logit_adjustment import adjust_logits
from meshnet.engine.logprobs import token_logprobs
from meshnet.engine.tail_sampler import TailSampler
from meshnet.engine.tokenizer import Tokenizer


def test_logprobs_are_the_models_log_softmax() -> None:
    logits = np.random.default_rng(0).standard_normal(500).astype(np.float32)
    logits[7] = logits[8] = logits.max() + 1.0  # a tie: the lower id comes first
    result = token_logprobs(logits, 42, LogprobRequest(5))
    reference = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    assert result.chosen.token_id == 42
    assert result.chosen.logprob == pytest.approx(reference[42], abs=1e-6)
    assert [entry.token_id for entry in result.top] == list(np.argsort(-reference, kind="stable")[:5])
    assert [entry.token_id for entry in result.top][:2] == [7, 8]
    assert all(entry.logprob <= 0.0 for entry in result.top)
    assert token_logprobs(logits, 42, LogprobRequest(0)).top == ()


def test_penalties_and_bias_follow_openai_formula() -> None:
    logits = np.zeros(10, np.float32)
    adjustments = LogitAdjustments(presence_penalty=0.5, frequency_penalty=0.25, logit_bias=((1, 3.0), (9, -100.0)))
    adjusted = adjust_logits(logits, adjustments, Counter({2: 4, 3: 1}))
    assert adjusted[1] == 3.0 and adjusted[9] == -100.0
    assert adjusted[2] == pytest.approx(-(4 * 0.25 + 0.5)) and adjusted[3] == pytest.approx(-(0.25 + 0.5))
    assert adjusted[0] == 0.0 and logits[1] == 0.0  # a copy: the engine's logits stay as they were
    with pytest.raises(InvalidArgument, match="vocabulary"):
        adjust_logits(logits, LogitAdjustments(logit_bias=((10, 1.0),)), Counter())


def test_frequency_penalty_stops_a_greedy_repeat() -> None:
    logits = np.array([0.0, 1.0, 0.9], np.float32)
    plain = TailSampler(SamplingParams())
    penalised = TailSampler(SamplingParams(adjustments=LogitAdjustments(frequency_penalty=0.2)))
    assert [plain.choose(logits, p)[0] for p in range(4)] == [1, 1, 1, 1]
    assert [penalised.choose(logits, p)[0] for p in range(4)] == [1, 2, 1, 2]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_model(tmp_path_factory.mktemp("model") / "tiny.gguf")


@pytest.fixture(scope="module")
def vocabulary(model: Path) -> GrammarVocabulary:
    return GrammarVocabulary(model)


@pytest.fixture(scope="module")
def tokenizer(model: Path) -> Tokenizer:
    return Tokenizer(describe_model(model))


def _generate(sampler: TailSampler, tokenizer: Tokenizer, seed: int, steps: int = 300) -> str:
    """Random logits that favour closing brackets and end-of-text, as a model nearly done would."""
    rng = np.random.default_rng(seed)
    closers = [tokenizer.encode(text, add_special=False)[-1] for text in ("}", "]")]
    pieces: list[bytes] = []
    for position in range(steps):
        logits = rng.standard_normal(tokenizer.n_vocab).astype(np.float32) * 3
        logits[closers] += 4.0
        logits[sorted(tokenizer.eos_token_ids)] += 8.0
        token, _ = sampler.choose(logits, position)
        if token in tokenizer.eos_token_ids:
            return b"".join(pieces).decode()
        pieces.append(tokenizer.token_bytes(token))
    raise AssertionError(f"no end of text after {steps} tokens: {b''.join(pieces)!r}")


@pytest.mark.parametrize(("temperature", "seed"), [(0.0, 0), (0.9, 1), (0.9, 2)])
def test_json_object_output_parses(
    vocabulary: GrammarVocabulary, tokenizer: Tokenizer, temperature: float, seed: int
) -> None:
    params = SamplingParams(temperature=temperature, seed=seed, constraint=json_object_constraint())
    sampler = TailSampler(params, vocabulary.matcher(json_object_constraint()))
    try:
        assert isinstance(json.loads(_generate(sampler, tokenizer, seed)), dict)
    finally:
        sampler.close()


def test_json_schema_output_matches_the_schema(vocabulary: GrammarVocabulary, tokenizer: Tokenizer) -> None:
    schema = {
        "type": "object",
        "properties": {"count": {"type": "integer"}, "ok": {"type": "boolean"}},
        "required": ["count", "ok"],
        "additionalProperties": False,
    }
    constraint = json_schema_constraint(schema)
    sampler = TailSampler(SamplingParams(constraint=constraint), vocabulary.matcher(constraint))
    try:
        answer = json.loads(_generate(sampler, tokenizer, 3))
    finally:
        sampler.close()
    assert set(answer) == {"count", "ok"}
    assert isinstance(answer["count"], int) and isinstance(answer["ok"], bool)


def test_unusable_schema_is_an_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="JSON schema"):
        json_schema_constraint({"$ref": "https://example.com/schema.json"})
