"""The prompts every lane sees: fixed texts, tokenized once, cut or tiled to an exact length.

Exact lengths make lanes comparable token for token; distinct openings make concurrent streams
different sequences (a batch of identical prompts would hide per-session work).
"""

from __future__ import annotations

from meshnet.core.errors import InvalidArgument
from meshnet.engine.tokenizer import Tokenizer

OPENINGS = (
    "Explain how a pipeline of machines can share the work of running one language model.",
    "Write a short story about a lighthouse keeper who collects old radios.",
    "List the steps to bake bread at home, and say why each step matters.",
    "Describe the water cycle to a curious ten year old.",
    "Summarize the history of the printing press in a few paragraphs.",
    "Compare trains and airplanes for travel across a large country.",
    "Give advice to someone starting to learn the violin as an adult.",
    "Why do leaves change colour in autumn? Answer step by step.",
)
CONTEXT_TEXT = "Read this long document and continue it."
FILLER = (
    " The quick brown fox jumps over the lazy dog while the committee discusses the budget,"
    " the weather report promises rain by evening, and a small boat drifts along the river"
    " past fields of wheat, old stone bridges and a market where people trade fruit and tools."
)


def tokens_of_length(tokenizer: Tokenizer, text: str, length: int) -> tuple[int, ...]:
    """``text`` tokenized, then tiled with filler and cut so exactly ``length`` tokens remain."""
    if length < 1:
        raise InvalidArgument(f"a prompt needs at least one token, asked for {length}")
    tokens = tokenizer.encode(text, add_special=True)
    filler = tokenizer.encode(FILLER, add_special=False)
    if not filler:
        raise InvalidArgument("the tokenizer produced no tokens for the filler text")
    while len(tokens) < length:
        tokens.extend(filler)
    return tuple(tokens[:length])


def build_prompts(tokenizer: Tokenizer, count: int, length: int) -> tuple[tuple[int, ...], ...]:
    """``count`` prompts of exactly ``length`` tokens, each opening with a different request."""
    return tuple(tokens_of_length(tokenizer, OPENINGS[i % len(OPENINGS)], length) for i in range(count))


def context_prompts(tokenizer: Tokenizer, contexts: list[int]) -> dict[int, tuple[int, ...]]:
    """One long prompt per context length, for the context-scaling phase."""
    return {c: tokens_of_length(tokenizer, CONTEXT_TEXT, c) for c in contexts}


def prefill_prompt(tokenizer: Tokenizer, length: int, room: int) -> tuple[int, ...]:
    """The prefill phase's one long prompt, cut to fit the model's context with ``room`` to spare;
    empty when ``length`` is 0 (the phase is skipped)."""
    fitted = min(length, tokenizer.context_length - room)
    return tokens_of_length(tokenizer, CONTEXT_TEXT, fitted) if length > 0 and fitted > 0 else ()
