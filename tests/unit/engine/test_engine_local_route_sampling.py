"""The in-process route chooses tokens with the tail's own sampler: logit_bias, penalties, the
seeded draw, logprobs and grammars mean the same in the oracle as in the swarm."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.core.errors import InvalidArgument
from meshnet.core.generation import GenerationRequest, SamplingParams
from meshnet.core.sampling_options import LogitAdjustments, LogprobRequest
from meshnet.engine.constraints import GrammarVocabulary, json_object_constraint
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute
from meshnet.engine.shards import open_local_route
from meshnet.engine.tail_sampler import TailSampler
from meshnet.engine.tokenizer import Tokenizer

PROMPT = (1, 270, 281, 289, 262, 280, 7, 9)
STEPS = 24


@pytest.fixture(scope="module")
def route(
    tiny_model: Path, small_llama_config: LlamaConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalRoute]:
    cache = SliceCache(tmp_path_factory.mktemp("cache"))
    opened = open_local_route(describe_model(tiny_model), 2, cache, small_llama_config)
    yield opened
    opened.close()


def _run(route: LocalRoute, params: SamplingParams) -> tuple[list[int], list[np.ndarray]]:
    rows: list[np.ndarray] = []
    tokens = list(route.generate(GenerationRequest(PROMPT, STEPS, params), on_logits=lambda r: rows.append(r.copy())))
    return tokens, rows


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(adjustments=LogitAdjustments(frequency_penalty=2.0, presence_penalty=1.0)),
        SamplingParams(temperature=0.9, seed=5, adjustments=LogitAdjustments(frequency_penalty=1.5)),
    ],
    ids=["greedy", "seeded"],
)
def test_penalties_shape_the_route_as_they_shape_the_tail(route: LocalRoute, params: SamplingParams) -> None:
    tokens, rows = _run(route, params)
    plain, _ = _run(route, SamplingParams(temperature=params.temperature, seed=params.seed))
    assert tokens != plain, "the penalties must change this answer, or the test shows nothing"
    # The tail's sampler fed the same model logits (before adjustment) picks the same tokens.
    tail = TailSampler(params)
    assert [tail.choose(row, len(PROMPT) + i)[0] for i, row in enumerate(rows)] == tokens


def test_logit_bias_bans_the_greedy_token(route: LocalRoute) -> None:
    plain, _ = _run(route, SamplingParams())
    banned = SamplingParams(adjustments=LogitAdjustments(logit_bias=((plain[0], -100.0),)))
    tokens, _ = _run(route, banned)
    assert plain[0] not in tokens


def test_logprobs_are_the_models_own(route: LocalRoute) -> None:
    params = SamplingParams(logprobs=LogprobRequest(3))
    rows: list[np.ndarray] = []
    choices = list(route.choices(GenerationRequest(PROMPT, 4, params), on_logits=lambda r: rows.append(r.copy())))
    for (token, logprobs), row in zip(choices, rows, strict=True):
        assert logprobs is not None and logprobs.chosen.token_id == token == int(np.argmax(row))
        shifted = row.astype(np.float64) - row.max()
        expected = shifted[token] - np.log(np.exp(shifted).sum())
        assert logprobs.chosen.logprob == pytest.approx(expected, abs=1e-5)
        assert logprobs.top[0].token_id == token and len(logprobs.top) == 3


def test_a_grammar_needs_the_vocabulary(
    route: LocalRoute, tiny_model: Path, small_llama_config: LlamaConfig, tmp_path: Path
) -> None:
    constrained = SamplingParams(constraint=json_object_constraint())
    with pytest.raises(InvalidArgument, match="no vocabulary to apply a grammar"):
        list(route.generate(GenerationRequest(PROMPT, 4, constrained)))
    description = describe_model(tiny_model)
    vocabulary, tokenizer = GrammarVocabulary(tiny_model), Tokenizer(description)
    closers = [tokenizer.encode("}", add_special=False)[-1], *sorted(tokenizer.eos_token_ids)]
    bias = LogitAdjustments(logit_bias=tuple(sorted((token, 30.0) for token in closers)))
    params = SamplingParams(adjustments=bias, constraint=json_object_constraint())
    request = GenerationRequest(PROMPT, 64, params, tokenizer.eos_token_ids)
    with_grammar = LocalRoute(route.backends, vocabulary)
    try:
        tokens = [t for t in with_grammar.generate(request) if t not in tokenizer.eos_token_ids]
        assert isinstance(json.loads(tokenizer.decode(tokens)), dict)
    finally:
        tokenizer.close()
        vocabulary.close()
