"""The ``response`` object and the streaming events of ``/v1/responses``.

The output is a list of items: an assistant ``message`` holding one ``output_text`` part for the
text, and a ``function_call`` item per call the reply makes when the request has function tools
(parsed by gateway/tools, so a call's arguments always parse and nothing of a call leaks into
the text), in the order the reply wrote them; the whole response is built by the stream's own
parser and writer, so it has the streamed items. Streamed, the events are those OpenAI sends, in its order, each with a
``sequence_number`` counted from 0 and an ``event:`` line naming its type: ``response.created``,
``response.in_progress``; per message ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta`` per piece of text,
``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``;
per call ``response.output_item.added``, ``response.function_call_arguments.delta`` (the whole
arguments once the call parsed), ``response.function_call_arguments.done``,
``response.output_item.done``; then ``response.completed``, or ``response.incomplete`` (status
``incomplete``, ``incomplete_details.reason`` ``max_output_tokens``) when the reply was cut by
``max_output_tokens``, as OpenAI ends such a stream. openai-python's ``responses.stream`` helper
(3.57) yields that event with the whole response, but its ``get_final_response()`` raises
"Didn't receive a `response.completed` event" after it, against OpenAI as here
(openai/openai-python#3538): read the terminal event's ``response`` instead. Telemetry and
keep-alives stay SSE comments the SDK skips; a failure mid-stream is the chat stream's ``error``
payload, which the SDK raises as an ``APIError``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from meshnet.gateway.choice_view import TextDelta
from meshnet.gateway.choices import Entry
from meshnet.gateway.errors import streamed_error
from meshnet.gateway.responses import Collected, total_usage
from meshnet.gateway.responses_api.body import ResponsesBody, text_config, tool_choice_json, tools_json
from meshnet.gateway.sse import KEEPALIVE, data_frame, telemetry_comment
from meshnet.gateway.telemetry_hub import TelemetryEvent
from meshnet.gateway.tools.parse import CallPiece, StreamPiece, ToolCall, ToolStreamParser
from meshnet.gateway.tools.plan import ToolPlan
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
    tools: list[dict[str, Any]]
    tool_choice: Any
    parallel_tool_calls: bool

    def item_id(self, kind: str, output_index: int) -> str:
        return f"{kind}-{self.request_id}" + ("" if output_index == 0 else f"-{output_index}")

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
            "parallel_tool_calls": self.parallel_tool_calls,
            "tool_choice": self.tool_choice,
            "tools": self.tools,
            "store": False,
            "text": self.text,
            "usage": None if outcome is None else usage_json(outcome.usage),
        }

    def message(self, output_index: int, text: str | None, status: str) -> dict[str, Any]:
        content = [] if text is None else [output_text(text)]
        item_id = self.item_id("msg", output_index)
        return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}

    def function_call(self, output_index: int, call: ToolCall, arguments: str, status: str) -> dict[str, Any]:
        return {
            "type": "function_call",
            "id": self.item_id("fc", output_index),
            "call_id": call.id,
            "name": call.name,
            "arguments": arguments,
            "status": status,
        }


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
        tools=tools_json(body),
        tool_choice=tool_choice_json(body),
        parallel_tool_calls=body.parallel_tool_calls is not False,
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


def response_object(header: ResponseHeader, collected: Sequence[Collected], tools: ToolPlan | None) -> dict[str, Any]:
    """The whole (non-streamed) ``response`` object of a request's one choice."""
    only = collected[0]
    outcome = Outcome(only.outcome.finish_reason, total_usage(choice.outcome for choice in collected))
    if tools is None or not tools.active:
        return header.response("completed", [header.message(0, only.text, "completed")], outcome)
    # The stream's own parser and writer, fed the whole text: the same items in the same order
    # (text written after a call is a message after it), so whole and streamed answers agree.
    parser, writer = ToolStreamParser(tools), EventWriter(header)
    _pieces(writer, [*parser.push(only.text), *parser.finish()])
    writer.closing(outcome)
    return header.response("completed", writer.items, outcome)


class EventWriter:
    """The numbered events of one streamed response: its items as they open and close."""

    def __init__(self, header: ResponseHeader) -> None:
        self.header = header
        self.sequence = 0
        self.items: list[dict[str, Any]] = []
        """The finished output items, in order."""
        self.text: list[str] | None = None
        """The text of the message being streamed; None while none is open."""

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\n".encode() + data_frame(payload)

    def _place(self) -> dict[str, Any]:
        index = len(self.items)
        return {"item_id": self.header.item_id("msg", index), "output_index": index, "content_index": 0}

    def opening(self) -> list[bytes]:
        started = self.header.response("in_progress", [])
        return [
            self._event("response.created", response=started),
            self._event("response.in_progress", response=started),
        ]

    def piece(self, piece: StreamPiece) -> list[bytes]:
        if isinstance(piece, CallPiece):
            return self.call(piece.call)
        return self.delta(piece.text)

    def delta(self, text: str) -> list[bytes]:
        frames = [] if self.text is not None else self._open_message()
        self.text = [*(self.text or []), text]
        return [*frames, self._event("response.output_text.delta", **self._place(), delta=text, logprobs=[])]

    def _open_message(self) -> list[bytes]:
        self.text = []
        index = len(self.items)
        return [
            self._event(
                "response.output_item.added", output_index=index, item=self.header.message(index, None, "in_progress")
            ),
            self._event("response.content_part.added", **self._place(), part=output_text("")),
        ]

    def _close_message(self) -> list[bytes]:
        if self.text is None:
            return []
        text, index = "".join(self.text), len(self.items)
        item = self.header.message(index, text, "completed")
        frames = [
            self._event("response.output_text.done", **self._place(), text=text, logprobs=[]),
            self._event("response.content_part.done", **self._place(), part=output_text(text)),
            self._event("response.output_item.done", output_index=index, item=item),
        ]
        self.items.append(item)
        self.text = None
        return frames

    def call(self, call: ToolCall) -> list[bytes]:
        frames = self._close_message()
        index = len(self.items)
        item = self.header.function_call(index, call, call.arguments, "completed")
        place = {"item_id": item["id"], "output_index": index}
        frames += [
            self._event(
                "response.output_item.added",
                output_index=index,
                item=self.header.function_call(index, call, "", "in_progress"),
            ),
            self._event("response.function_call_arguments.delta", **place, delta=call.arguments),
            self._event("response.function_call_arguments.done", **place, arguments=call.arguments),
            self._event("response.output_item.done", output_index=index, item=item),
        ]
        self.items.append(item)
        return frames

    def closing(self, outcome: Outcome) -> list[bytes]:
        if not self.items and self.text is None:
            self.text = []  # an empty reply is still one (empty) message
            frames = self._open_message()
        else:
            frames = []
        frames += self._close_message()
        final = self.header.response("completed", self.items, outcome)
        return [*frames, self._event(f"response.{final['status']}", response=final)]


async def event_stream(
    header: ResponseHeader, entries: AsyncIterator[Entry | None], tools: ToolPlan | None
) -> AsyncIterator[bytes]:
    """The SSE frames of a streamed response from its one choice's shown items."""
    writer = EventWriter(header)
    parser = None if tools is None or not tools.active else ToolStreamParser(tools)
    for frame in writer.opening():
        yield frame
    async for entry in entries:
        if entry is None:
            yield KEEPALIVE
            continue
        for item in entry[1]:
            if isinstance(item, TelemetryEvent):
                yield telemetry_comment(item)
                continue
            if isinstance(item, Failure):
                yield data_frame(streamed_error(item.error, header.request_id))
                return
            if isinstance(item, TextDelta):
                frames = writer.delta(item.text) if parser is None else _pieces(writer, parser.push(item.text))
            else:
                rest = [] if parser is None else _pieces(writer, parser.finish())
                frames = [*rest, *writer.closing(item)]
            for frame in frames:
                yield frame
            if not isinstance(item, TextDelta):
                return


def _pieces(writer: EventWriter, pieces: list[StreamPiece]) -> list[bytes]:
    return [frame for piece in pieces for frame in writer.piece(piece)]


@dataclass(frozen=True)
class ResponsesShape:
    """The ``service.AnswerShape`` of ``/v1/responses``."""

    header: ResponseHeader
    tools: ToolPlan | None = None

    def whole(self, collected: Sequence[Collected]) -> dict[str, Any]:
        return response_object(self.header, collected, self.tools)

    def stream(self, entries: AsyncIterator[Entry | None]) -> AsyncIterator[bytes]:
        return event_stream(self.header, entries, self.tools)
