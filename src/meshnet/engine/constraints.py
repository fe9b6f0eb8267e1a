"""Grammar-constrained output with llama.cpp's own grammar sampler, over a tail's logits.

``response_format`` becomes a GBNF grammar (``json_object``: llama.cpp's JSON grammar;
``json_schema``: llama.cpp's JSON-schema converter, shipped in llama-cpp-python). The tail keeps
one ``GrammarMatcher`` per session: before each token it masks every token the grammar forbids
(llama.cpp sets their logit to -inf), after it accepts the chosen one. End-of-generation is
allowed only where the grammar is complete, so a finished answer always parses.

A tail slice keeps the tokenizer (artifact/slicing.py), but the matcher needs only the
vocabulary, so ``GrammarVocabulary`` loads the model ``vocab_only``, as the gateway's tokenizer does.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

from meshnet.core.errors import EngineError, GrammarTooLarge, InvalidArgument
from meshnet.core.sampling_options import MAX_GRAMMAR_CHARS, OutputConstraint
from meshnet.engine import llama_ffi
from meshnet.engine.grammar_bound import check_grammar_size

ANCHOR = "^"
"""A trigger word that starts with this engages only at the reply's start (after whitespace), as
llama.cpp's ``PATTERN_FULL`` triggers do: Llama 3's bare ``{"name"`` call is a whole reply, and a
JSON record later in a text answer must stay text."""

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
"""The layout of llama.cpp's ``llama_token_data``."""


def json_object_constraint() -> OutputConstraint:
    """``response_format: {"type": "json_object"}``: any JSON object."""
    return OutputConstraint(JSON_GBNF)


def json_schema_constraint(schema: Mapping[str, Any]) -> OutputConstraint:
    """``response_format: {"type": "json_schema"}``: JSON that matches ``schema``.

    InvalidArgument when llama.cpp's converter cannot express the schema (for example a remote
    ``$ref``), so the client hears it before any generation starts; ``GrammarTooLarge`` when the
    grammar would pass ``MAX_GRAMMAR_CHARS``, estimated from the schema before anything is built
    (``grammar_bound``). The build is CPU work: a server runs it off its event loop
    (``meshnet.engine.grammar_process``).
    """
    check_grammar_size(schema)
    try:
        grammar = json_schema_to_gbnf(json.dumps(schema))
    except Exception as err:  # the converter raises ValueError, KeyError, AssertionError ...
        raise InvalidArgument(f"the JSON schema cannot be turned into a grammar: {err!r}") from None
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise GrammarTooLarge(f"the JSON schema's grammar is {len(grammar)} characters; at most {MAX_GRAMMAR_CHARS}")
    return OutputConstraint(grammar)


class GrammarVocabulary:
    """A model's vocabulary, loaded once per tail, to build one grammar matcher per session."""

    def __init__(self, model_path: Path) -> None:
        self._model = llama_ffi.load_vocabulary(model_path)
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))

    def matcher(self, constraint: OutputConstraint) -> GrammarMatcher:
        """The session's matcher: lazy (engaging at a trigger word) when the constraint has any."""
        if constraint.triggers:
            return LazyGrammarMatcher(self, constraint)
        return self.strict_matcher(constraint)

    def strict_matcher(self, constraint: OutputConstraint) -> StrictGrammarMatcher:
        sampler = llama_cpp.llama_sampler_init_grammar(
            self._vocab, constraint.grammar.encode(), constraint.root.encode()
        )
        if not sampler:
            raise InvalidArgument("llama.cpp could not parse the grammar (check its rules and root)")
        return StrictGrammarMatcher(sampler, self.n_vocab)

    def piece(self, token: int) -> bytes:
        """The bytes ``token`` writes (control tokens write none, as in the client's text)."""
        buffer = ctypes.create_string_buffer(256)
        count = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, 256, 0, False)
        return buffer.raw[: max(count, 0)]

    def close(self) -> None:
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        # A tail holds its vocabulary for the life of the process; free it with the object.
        self.close()


class StrictGrammarMatcher:
    """One session's grammar state: which tokens may come next; advanced token by token."""

    def __init__(self, sampler: Any, n_vocab: int) -> None:
        self._sampler = sampler
        self._candidates = np.zeros(n_vocab, dtype=_TOKEN_DATA)
        self._candidates["id"] = np.arange(n_vocab, dtype=np.int32)
        self._one = np.zeros(1, dtype=_TOKEN_DATA)

    def _apply(self, candidates: np.ndarray) -> None:
        if not self._sampler:
            raise EngineError("the grammar matcher was already closed")
        view = llama_cpp.llama_token_data_array(
            data=candidates.ctypes.data_as(llama_cpp.llama_token_data_p),
            size=candidates.shape[0],
            selected=-1,
            sorted=False,
        )
        llama_cpp.llama_sampler_apply(self._sampler, ctypes.byref(view))

    def allows(self, token: int) -> bool:
        """Whether the grammar allows ``token`` next (a cheap check of one candidate)."""
        self._one["id"], self._one["logit"] = token, 0.0
        self._apply(self._one)
        return bool(np.isfinite(self._one["logit"][0]))

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of float32 ``logits`` [n_vocab] with every forbidden token at -inf."""
        if logits.shape[0] != self._candidates.shape[0]:
            n_vocab = self._candidates.shape[0]
            raise EngineError(f"logits for {logits.shape[0]} tokens; the grammar's vocabulary has {n_vocab}")
        self._candidates["logit"] = logits
        self._apply(self._candidates)
        masked = np.array(self._candidates["logit"], dtype=np.float32)
        if not np.isfinite(masked).any():
            raise EngineError("the grammar allows no token here")
        return masked

    def accept(self, token: int) -> None:
        """Advance past ``token``; only ever a token ``allows`` or ``mask`` let through."""
        if not self._sampler:
            raise EngineError("the grammar matcher was already closed")
        llama_cpp.llama_sampler_accept(self._sampler, token)

    def close(self) -> None:
        if self._sampler:
            llama_cpp.llama_sampler_free(self._sampler)
            self._sampler = None


class LazyGrammarMatcher:
    """A grammar that holds only once a trigger word is generated (``tool_choice: auto``).

    llama.cpp's own lazy sampler replays the text from the trigger into the grammar and throws a
    C++ exception -- which aborts the process -- when that text does not fit it (a token that
    carries more than the trigger). Here the trigger is found in Python over the tokens' bytes;
    the grammar engages only when the trigger starts exactly at a token, and the tokens from there
    are fed through ``allows`` first: text that does not fit leaves the rest of the reply free
    (the gateway then reads it as content). Everything depends only on the tokens chosen, in
    order, so a failover replay rebuilds the same state.
    """

    def __init__(self, vocabulary: GrammarVocabulary, constraint: OutputConstraint) -> None:
        self._vocabulary = vocabulary
        self._constraint = constraint
        self._triggers = [word.encode() for word in constraint.triggers if not word.startswith(ANCHOR)]
        self._anchored = [word[len(ANCHOR) :].encode() for word in constraint.triggers if word.startswith(ANCHOR)]
        self._text = b""
        self._starts: list[tuple[int, int]] = []
        """(byte offset, token) of each token generated while waiting for a trigger."""
        self._inner: StrictGrammarMatcher | None = None
        self._free = False
        """The trigger came but its text did not fit the grammar: nothing is constrained any more."""

    @property
    def engaged(self) -> bool:
        return self._inner is not None

    def allows(self, token: int) -> bool:
        return True if self._inner is None else self._inner.allows(token)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        return logits if self._inner is None else self._inner.mask(logits)

    def accept(self, token: int) -> None:
        if self._inner is not None:
            self._inner.accept(token)
            return
        if self._free:
            return
        before = len(self._text)
        self._starts.append((before, token))
        self._text += self._vocabulary.piece(token)
        hits = [*self._found_anywhere(before), *self._found_at_start()]
        if hits:
            self._engage(min(hits))

    def _found_anywhere(self, before: int) -> list[int]:
        longest = max((len(word) for word in self._triggers), default=0)
        found = [self._text.find(word, max(0, before - longest)) for word in self._triggers]
        return [at for at in found if at >= 0]

    def _found_at_start(self) -> list[int]:
        start = len(self._text) - len(self._text.lstrip())
        return [start for word in self._anchored if self._text.startswith(word, start)]

    def _engage(self, at: int) -> None:
        ends = [offset for offset, _ in self._starts[1:]] + [len(self._text)]
        # A token that writes nothing where the trigger starts (Llama 3's <|python_tag|>, a
        # control token) comes before the call's text: it is not the grammar's to take.
        replay = [token for (offset, token), end in zip(self._starts, ends, strict=True) if offset >= at and end > at]
        if not any(offset == at for offset, _ in self._starts):
            self._free = True  # the trigger starts inside a token: its text cannot be fed alone
            return
        inner = self._vocabulary.strict_matcher(replace(self._constraint, triggers=()))
        for token in replay:
            if not inner.allows(token):
                inner.close()
                self._free = True
                return
            inner.accept(token)
        self._inner = inner

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()
            self._inner = None


GrammarMatcher = StrictGrammarMatcher | LazyGrammarMatcher
"""What a tail session samples under: the whole reply constrained, or only from a trigger on."""
