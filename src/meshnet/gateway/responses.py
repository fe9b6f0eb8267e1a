"""OpenAI response objects: whole completions and streaming chunks, for chat and text.

Plain dict builders, so the wire shape is visible in one place. The ``id`` of every object is
the gateway's request id, which is also the ``x-request-id`` header and the key of the
telemetry endpoints.
"""

from __future__ import annotations

from typing import Any

from meshnet.gateway.driver import Outcome
from meshnet.gateway.prepare import EndpointKind


def completion_object(
    kind: EndpointKind, request_id: str, model: str, created: int, text: str, outcome: Outcome
) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` or ``text_completion`` object."""
    if kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": outcome.finish_reason,
        }
        object_name = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": outcome.finish_reason,
        }
        object_name = "text_completion"
    return {
        "id": request_id,
        "object": object_name,
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [choice],
        "usage": outcome.usage.as_json(),
    }


class ChunkWriter:
    """Builds the streaming chunks of one request (``chat.completion.chunk`` or text)."""

    def __init__(self, kind: EndpointKind, request_id: str, model: str, created: int) -> None:
        self.kind = kind
        self.request_id = request_id
        self.model = model
        self.created = created

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

    def _choice(self, text: str | None, finish_reason: str | None, *, role: bool = False) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}

    def opening(self) -> dict[str, Any] | None:
        """Chat streams open with the assistant role, as OpenAI's do; text streams need nothing."""
        if self.kind != "chat":
            return None
        return self._chunk([self._choice("", None, role=True)])

    def delta(self, text: str) -> dict[str, Any]:
        return self._chunk([self._choice(text, None)])

    def closing(self, outcome: Outcome) -> dict[str, Any]:
        empty = None if self.kind == "chat" else ""
        return self._chunk([self._choice(empty, outcome.finish_reason)])

    def usage(self, outcome: Outcome) -> dict[str, Any]:
        """The extra last chunk asked for by ``stream_options.include_usage``: no choices."""
        return self._chunk([], usage=outcome.usage.as_json())
