"""OpenAI response objects: whole completions and streaming chunks, for chat and text.

Plain dict builders, so the wire shape is visible in one place. The ``id`` of every object is
the gateway's request id, which is also the ``x-request-id`` header and the key of the
telemetry endpoints. A request with ``n`` > 1 has one choice per index, all in one object
(or, streamed, chunks that each name their choice's index).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from meshnet.gateway.logprob_format import LogprobEntry, chat_logprobs, text_logprobs
from meshnet.gateway.prepare import EndpointKind
from meshnet.route.life import Outcome, Usage


@dataclass(frozen=True)
class Collected:
    """One choice, generated to its end."""

    text: str
    outcome: Outcome
    logprobs: tuple[LogprobEntry, ...] | None = None
    """Every generated token's logprobs; None when the request did not ask for them."""


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "billing_units": usage.billing_units,
    }


def total_usage(outcomes: Iterable[Outcome]) -> Usage:
    """The usage of a request: its choices' usages summed (the prompt counted once)."""
    return functools.reduce(operator.add, (outcome.usage for outcome in outcomes))


def completion_object(
    kind: EndpointKind, request_id: str, model: str, created: int, choices: Sequence[Collected]
) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` or ``text_completion`` object."""
    built: list[dict[str, Any]] = []
    for index, choice in enumerate(choices):
        if kind == "chat":
            logprobs = None if choice.logprobs is None else chat_logprobs(choice.logprobs)
            body: dict[str, Any] = {"message": {"role": "assistant", "content": choice.text}}
        else:
            logprobs = None if choice.logprobs is None else text_logprobs(choice.logprobs)
            body = {"text": choice.text}
        built.append({"index": index, **body, "logprobs": logprobs, "finish_reason": choice.outcome.finish_reason})
    return {
        "id": request_id,
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": built,
        "usage": usage_json(total_usage(choice.outcome for choice in choices)),
    }


class ChunkWriter:
    """Builds the streaming chunks of one request (``chat.completion.chunk`` or text)."""

    def __init__(
        self, kind: EndpointKind, request_id: str, model: str, created: int, *, logprobs: bool = False
    ) -> None:
        self.kind = kind
        self.request_id = request_id
        self.model = model
        self.created = created
        self.logprobs = logprobs
        self._text_offsets: dict[int, int] = {}
        """Per choice, how much text its earlier chunks carried (legacy ``text_offset``)."""

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        object_name = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {
            "id": self.request_id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
            **extra,
        }

    def _logprobs(self, index: int, entries: Sequence[LogprobEntry]) -> dict[str, Any] | None:
        if not self.logprobs or not entries:
            return None
        if self.kind == "chat":
            return chat_logprobs(entries)
        return text_logprobs(entries, self._text_offsets.get(index, 0))

    def _choice(
        self,
        index: int,
        text: str | None,
        finish_reason: str | None,
        *,
        role: bool = False,
        logprobs: Sequence[LogprobEntry] = (),
    ) -> dict[str, Any]:
        shaped = self._logprobs(index, logprobs)
        if self.kind == "chat":
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            return {"index": index, "delta": delta, "logprobs": shaped, "finish_reason": finish_reason}
        self._text_offsets[index] = self._text_offsets.get(index, 0) + len(text or "")
        return {"index": index, "text": text or "", "logprobs": shaped, "finish_reason": finish_reason}

    def opening(self, index: int = 0) -> dict[str, Any] | None:
        """Chat streams open with the assistant role, as OpenAI's do; text streams need nothing."""
        if self.kind != "chat":
            return None
        return self._chunk([self._choice(index, "", None, role=True)])

    def delta(self, text: str, index: int = 0, logprobs: Sequence[LogprobEntry] = ()) -> dict[str, Any]:
        return self._chunk([self._choice(index, text, None, logprobs=logprobs)])

    def choice_delta(self, index: int, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        """A chat chunk with a ``delta`` built elsewhere (tool calls: gateway/tools/shape.py)."""
        return self._chunk([{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}])

    def closing(self, outcome: Outcome, index: int = 0) -> dict[str, Any]:
        empty = None if self.kind == "chat" else ""
        return self._chunk([self._choice(index, empty, outcome.finish_reason)])

    def usage(self, usage: Usage) -> dict[str, Any]:
        """The extra last chunk asked for by ``stream_options.include_usage``: no choices."""
        return self._chunk([], usage=usage_json(usage))
