"""Tool calls in the chat completion object and in its stream, as OpenAI shapes them.

Whole: the message gets ``tool_calls`` (``content`` keeps the text besides the calls, or None)
and ``finish_reason`` becomes ``"tool_calls"`` (a reply cut by ``max_tokens`` keeps ``length``;
a call it cut short is dropped, so such a reply may carry ``content: null`` and no calls).
Streamed: content deltas until a call starts; each parsed call then as one delta with its
``index``, ``id``, ``type`` and ``name`` (arguments ``""``) followed by one with its arguments,
which the official client's accumulation joins into the call; the last chunk's
``finish_reason`` is ``"tool_calls"``. Logprobs are not reported alongside tools.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from meshnet.gateway.tools.parse import CallPiece, StreamPiece, ToolCall, ToolStreamParser, new_call_id, parse_reply
from meshnet.gateway.tools.plan import ToolPlan
from meshnet.route.life import Outcome

ChoiceDelta = Callable[[int, dict[str, Any], str | None], dict[str, Any]]
"""Builds one chat chunk from a choice's index, its delta and finish reason
(``responses.ChunkWriter.choice_delta``; passed in so this package does not import the response
builders, which import ``prepare``)."""


def call_json(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _finish(finish_reason: str, calls: int) -> str:
    return "tool_calls" if calls and finish_reason == "stop" else finish_reason


def shape_completion(
    body: Mapping[str, Any], plan: ToolPlan, new_id: Callable[[], str] = new_call_id
) -> dict[str, Any]:
    """A ``chat.completion`` object with each choice's calls parsed out of its text."""
    choices = []
    for choice in body["choices"]:
        text = choice["message"]["content"]
        reply = parse_reply(text, plan, new_id)
        if reply.calls or reply.content != text:
            calls = {"tool_calls": [call_json(c) for c in reply.calls]} if reply.calls else {}
            message = {"role": "assistant", "content": reply.content, **calls}
            choice = {**choice, "message": message, "finish_reason": _finish(choice["finish_reason"], len(reply.calls))}
        choices.append(choice)
    return {**body, "choices": choices}


class ToolStreamShaper:
    """The chunks of a streamed chat completion whose choices may call tools."""

    def __init__(self, plan: ToolPlan, chunk: ChoiceDelta, choices: int) -> None:
        self._chunk = chunk
        self._parsers = [ToolStreamParser(plan) for _ in range(choices)]

    def delta(self, text: str, index: int) -> list[dict[str, Any]]:
        return self._chunks(self._parsers[index].push(text), index)

    def closing(self, outcome: Outcome, index: int) -> list[dict[str, Any]]:
        parser = self._parsers[index]
        chunks = self._chunks(parser.finish(), index)
        return [*chunks, self._chunk(index, {}, _finish(outcome.finish_reason, parser.calls))]

    def _chunks(self, pieces: list[StreamPiece], index: int) -> list[dict[str, Any]]:
        chunks: list[dict[str, Any]] = []
        for piece in pieces:
            if not isinstance(piece, CallPiece):
                chunks.append(self._chunk(index, {"content": piece.text}, None))
                continue
            call = piece.call
            opening = {"index": piece.index, "id": call.id, "type": "function"}
            named = {**opening, "function": {"name": call.name, "arguments": ""}}
            chunks.append(self._chunk(index, {"tool_calls": [named]}, None))
            arguments = {"index": piece.index, "function": {"arguments": call.arguments}}
            chunks.append(self._chunk(index, {"tool_calls": [arguments]}, None))
        return chunks
