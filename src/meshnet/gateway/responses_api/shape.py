"""The ``response`` object and the streaming events of ``/v1/responses``.

One assistant message holding one ``output_text`` part is the whole output (no tools, no
reasoning items). Streamed, the events are those OpenAI sends, in its order, each with a
``sequence_number`` counted from 0 and an ``event:`` line naming its type:
``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta`` per piece of text,
``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``,
``response.completed``. Telemetry and keep-alives stay SSE comments the SDK skips; a failure
mid-stream is the chat stream's ``error`` payload, which the SDK raises as an ``APIError``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from meshnet.gateway.choice_view import TextDelta
from meshnet.gateway.choices import Entry
from meshnet.gateway.errors import streamed_error
from meshnet.gateway.responses import Collected, total_usage
from meshnet.gateway.responses_api.body import ResponsesBody, text_config
from meshnet.gateway.sse import KEEPALIVE, data_frame, telemetry_comment
from meshnet.gateway.telemetry_hub import TelemetryEvent
from meshnet.route.life import Failure, Outcome, Usage


@dataclass(frozen=True)
class ResponseHeader:
    """What every ``response`` object of one request repeats: the request's own settings."""

    request_id: str
    model: str
    created: int
    instructions: str | None
    max_output_tokens: int | None
    temperature: float | None
    top_p: float | None
    text: dict[str, Any]

    @property
    def message_id(self) -> str:
        return f"msg-{self.request_id}"

    def response(self, status: str, output: list[dict[str, Any]], outcome: Outcome | None = None) -> dict[str, Any]:
        incomplete = outcome is not None and outcome.finish_reason == "length"
        return {
            "id": self.request_id,
            "object": "response",
            "created_at": self.created,
            "model": self.model,
            "status": "incomplete" if incomplete else status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "output": output,
            "parallel_tool_calls": False,
            "tool_choice": "none",
            "tools": [],
            "store": False,
            "text": self.text,
            "usage": None if outcome is None else usage_json(outcome.usage),
        }

    def message(self, text: str | None, status: str) -> dict[str, Any]:
        content = [] if text is None else [output_text(text)]
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant", "content": content}


def response_header(body: ResponsesBody, request_id: str, created: int) -> ResponseHeader:
    return ResponseHeader(
        request_id=request_id,
        model=body.model,
        created=created,
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        text=text_config(body),
    )


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def response_object(header: ResponseHeader, collected: Sequence[Collected]) -> dict[str, Any]:
    """The whole (non-streamed) ``response`` object of a request's one choice."""
    only = collected[0]
    outcome = Outcome(only.outcome.finish_reason, total_usage(choice.outcome for choice in collected))
    return header.response("completed", [header.message(only.text, "completed")], outcome)


class EventWriter:
    """The numbered events of one streamed response; keeps the text sent so far."""

    def __init__(self, header: ResponseHeader) -> None:
        self.header = header
        self.sequence = 0
        self.text: list[str] = []

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\n".encode() + data_frame(payload)

    def _place(self) -> dict[str, Any]:
        return {"item_id": self.header.message_id, "output_index": 0, "content_index": 0}

    def opening(self) -> list[bytes]:
        started = self.header.response("in_progress", [])
        return [
            self._event("response.created", response=started),
            self._event("response.in_progress", response=started),
            self._event("response.output_item.added", output_index=0, item=self.header.message(None, "in_progress")),
            self._event("response.content_part.added", **self._place(), part=output_text("")),
        ]

    def delta(self, text: str) -> bytes:
        self.text.append(text)
        return self._event("response.output_text.delta", **self._place(), delta=text, logprobs=[])

    def closing(self, outcome: Outcome) -> list[bytes]:
        text = "".join(self.text)
        item = self.header.message(text, "completed")
        return [
            self._event("response.output_text.done", **self._place(), text=text, logprobs=[]),
            self._event("response.content_part.done", **self._place(), part=output_text(text)),
            self._event("response.output_item.done", output_index=0, item=item),
            self._event("response.completed", response=self.header.response("completed", [item], outcome)),
        ]


async def event_stream(header: ResponseHeader, entries: AsyncIterator[Entry | None]) -> AsyncIterator[bytes]:
    """The SSE frames of a streamed response from its one choice's shown items."""
    writer = EventWriter(header)
    for frame in writer.opening():
        yield frame
    async for entry in entries:
        if entry is None:
            yield KEEPALIVE
            continue
        for item in entry[1]:
            if isinstance(item, TextDelta):
                yield writer.delta(item.text)
            elif isinstance(item, TelemetryEvent):
                yield telemetry_comment(item)
            elif isinstance(item, Failure):
                yield data_frame(streamed_error(item.error, header.request_id))
                return
            else:
                for frame in writer.closing(item):
                    yield frame
                return


@dataclass(frozen=True)
class ResponsesShape:
    """The ``service.AnswerShape`` of ``/v1/responses``."""

    header: ResponseHeader

    def whole(self, collected: Sequence[Collected]) -> dict[str, Any]:
        return response_object(self.header, collected)

    def stream(self, entries: AsyncIterator[Entry | None]) -> AsyncIterator[bytes]:
        return event_stream(self.header, entries)
