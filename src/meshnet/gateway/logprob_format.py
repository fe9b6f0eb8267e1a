"""OpenAI's logprobs objects, built from the tail's ``TokenLogprobs`` and the model's tokenizer.

Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}``.
Completions (legacy): ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}``.
A token that ends mid-character shows as text with U+FFFD; ``bytes`` always holds its exact bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from meshnet.core.sampling_options import TokenLogprob, TokenLogprobs
from meshnet.gateway.ports import TextCodec


@dataclass(frozen=True)
class TokenAlternative:
    text: str
    raw: bytes
    logprob: float


@dataclass(frozen=True)
class LogprobEntry:
    """One generated token as OpenAI reports it: its own logprob and the top alternatives."""

    chosen: TokenAlternative
    top: tuple[TokenAlternative, ...]


def logprob_entry(logprobs: TokenLogprobs, codec: TextCodec) -> LogprobEntry:
    def alternative(entry: TokenLogprob) -> TokenAlternative:
        raw = codec.token_bytes(entry.token_id)
        return TokenAlternative(raw.decode("utf-8", errors="replace"), raw, entry.logprob)

    return LogprobEntry(alternative(logprobs.chosen), tuple(alternative(entry) for entry in logprobs.top))


def _chat_item(item: TokenAlternative) -> dict[str, Any]:
    return {"token": item.text, "logprob": item.logprob, "bytes": list(item.raw)}


def chat_logprobs(entries: Sequence[LogprobEntry]) -> dict[str, Any]:
    content = [{**_chat_item(entry.chosen), "top_logprobs": [_chat_item(t) for t in entry.top]} for entry in entries]
    return {"content": content, "refusal": None}


def text_logprobs(entries: Sequence[LogprobEntry], start_offset: int = 0) -> dict[str, Any]:
    """The legacy object; ``start_offset`` is where the first entry's text sits in the choice's text."""
    offsets: list[int] = []
    offset = start_offset
    for entry in entries:
        offsets.append(offset)
        offset += len(entry.chosen.text)
    return {
        "tokens": [entry.chosen.text for entry in entries],
        "token_logprobs": [entry.chosen.logprob for entry in entries],
        "top_logprobs": [{t.text: t.logprob for t in entry.top} for entry in entries],
        "text_offset": offsets,
    }
