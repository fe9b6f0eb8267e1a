"""The lazy grammar of ``tool_choice: auto`` with llama.cpp's grammar sampler over a real vocabulary.

Free text until the trigger word; from the word on, the call grammar holds, so a reply that
starts a call can only finish a valid one; a trigger whose following text does not fit leaves
the rest free instead of aborting the process (llama.cpp's own lazy sampler throws there).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.core.generation import SamplingParams
from meshnet.core.sampling_options import OutputConstraint
from meshnet.engine.constraints import ANCHOR, GrammarVocabulary, LazyGrammarMatcher, json_schema_constraint
from meshnet.engine.tail_sampler import TailSampler
from meshnet.engine.tokenizer import Tokenizer

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def vocabulary(synthetic_model_factory: Callable[[SyntheticSpec], Path]) -> Iterator[GrammarVocabulary]:
    held = GrammarVocabulary(synthetic_model_factory(SyntheticSpec()))
    yield held
    held.close()


@pytest.fixture(scope="module")
def tokenizer(synthetic_model_factory: Callable[[SyntheticSpec], Path]) -> Iterator[Tokenizer]:
    held = Tokenizer(describe_model(synthetic_model_factory(SyntheticSpec())))
    yield held
    held.close()


def _lazy() -> OutputConstraint:
    call = json_schema_constraint(SCHEMA).grammar.replace("root ::=", "call ::=", 1)
    return OutputConstraint(f'root ::= "<tool_call>" call "</tool_call>"\n{call}', triggers=("<tool_call>",))


def _tokens(tokenizer: Tokenizer, text: str) -> list[int]:
    tokens = tokenizer.encode(text, add_special=False)
    return tokens[1:] if tokenizer.token_bytes(tokens[0]) == b" " else tokens  # SentencePiece's space prefix


def test_free_text_until_the_trigger_then_only_a_valid_call(
    vocabulary: GrammarVocabulary, tokenizer: Tokenizer
) -> None:
    matcher = vocabulary.matcher(_lazy())
    assert isinstance(matcher, LazyGrammarMatcher)
    sampler = TailSampler(SamplingParams(temperature=0.9, seed=1, constraint=_lazy()), matcher)
    try:
        logits = np.random.default_rng(0).standard_normal(tokenizer.n_vocab).astype(np.float32)
        assert matcher.mask(logits) is logits  # nothing is constrained before a call starts
        prefix = _tokens(tokenizer, "Let me see. <tool_call>")
        sampler.advance(tuple(prefix))
        assert matcher.engaged
        rng = np.random.default_rng(2)
        closers = [tokenizer.encode(text, add_special=False)[-1] for text in ("}", ">")]
        chosen: list[int] = []
        for position in range(len(prefix), len(prefix) + 300):
            logits = rng.standard_normal(tokenizer.n_vocab).astype(np.float32) * 3
            logits[closers] += 4.0
            logits[sorted(tokenizer.eos_token_ids)] += 8.0
            token, _ = sampler.choose(logits, position)
            if token in tokenizer.eos_token_ids:
                break
            chosen.append(token)
        text = tokenizer.decode(chosen)
    finally:
        sampler.close()
    assert text.endswith("</tool_call>"), text
    assert isinstance(json.loads(text.removesuffix("</tool_call>"), strict=False)["n"], int)


def test_a_trigger_whose_text_the_grammar_refuses_leaves_the_reply_free(
    vocabulary: GrammarVocabulary, tokenizer: Tokenizer
) -> None:
    # The replayed trigger text is checked token by token before the grammar takes it, so a
    # mismatch (here a grammar that never starts with the trigger) cannot abort the process.
    mismatched = OutputConstraint(json_schema_constraint(SCHEMA).grammar, triggers=("<tool_call>",))
    matcher = vocabulary.matcher(mismatched)
    try:
        for token in _tokens(tokenizer, "words <tool_call>hello"):
            assert matcher.allows(token)
            matcher.accept(token)
        assert not matcher.engaged
        logits = np.zeros(tokenizer.n_vocab, np.float32)
        assert matcher.mask(logits) is logits and all(matcher.allows(eos) for eos in tokenizer.eos_token_ids)
    finally:
        matcher.close()


def test_a_reply_without_the_trigger_is_never_constrained(vocabulary: GrammarVocabulary, tokenizer: Tokenizer) -> None:
    matcher = vocabulary.matcher(_lazy())
    try:
        for token in _tokens(tokenizer, "plain words < tool_call > and more"):
            assert matcher.allows(token)
            matcher.accept(token)
        assert not matcher.engaged
    finally:
        matcher.close()


def test_an_anchored_trigger_engages_only_at_the_start_of_the_reply(
    vocabulary: GrammarVocabulary, tokenizer: Tokenizer
) -> None:
    # Llama 3's bare call is the whole reply: a JSON record shown later in a text answer must
    # not switch the call grammar on (it would force a call, then be read back as text).
    bare = OutputConstraint(json_schema_constraint(SCHEMA).grammar, triggers=(ANCHOR + '{"n"',))
    for text, engaged in (('Example:\n{"n": 3}', False), (' {"n": 3}', True), ('{"n"', True)):
        matcher = vocabulary.matcher(bare)
        try:
            for token in _tokens(tokenizer, text):
                matcher.accept(token)
            assert isinstance(matcher, LazyGrammarMatcher) and matcher.engaged is engaged, text
        finally:
            matcher.close()


def test_a_control_token_before_the_trigger_is_not_replayed(
    vocabulary: GrammarVocabulary, tokenizer: Tokenizer
) -> None:
    # Llama 3 may open its call with <|python_tag|>, a control token that writes no text.
    bare = OutputConstraint(json_schema_constraint(SCHEMA).grammar, triggers=(ANCHOR + '{"n"',))
    control = min(tokenizer.eos_token_ids)
    assert vocabulary.piece(control) == b""
    matcher = vocabulary.matcher(bare)
    try:
        for token in [control, *_tokens(tokenizer, '{"n"')]:
            matcher.accept(token)
        assert matcher.engaged
    finally:
        matcher.close()
