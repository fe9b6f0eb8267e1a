"""Generated text back into OpenAI tool calls: whole (``parse_reply``) or token by token.

A call is only reported when its JSON parses, names a function of the request and carries an
object of arguments; anything else stays content, so no call is ever lost or half-shown. Text
that may still become a call (a prefix of ``<tool_call>``, or for ``LLAMA3_JSON`` a reply that
starts with ``{``) is held back while streaming and never leaks into ``content`` once a call
is parsed from it (the failure exo #1100 reports). Arguments are streamed when their call is
complete: a client never receives arguments that later turn out not to parse.

A call the reply opened but never finished (``max_tokens`` or a stop string cut it) is dropped,
neither a call nor content: the client gets ``finish_reason: "length"`` with the calls that did
finish, or ``content: null``, never the call's raw syntax. Without ``several_calls``
(``parallel_tool_calls: false``, a named choice, Llama 3) only the first call is reported, even
where no grammar held the reply to one. Whitespace that ends content is held back until more
text follows, and dropped when a call comes or the reply ends in calls: the stream and the whole
reply carry the same content, the whole reply being the stream's pieces joined.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from meshnet.gateway.tools.formats import PYTHON_TAG, ToolFormat
from meshnet.gateway.tools.plan import ToolPlan


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """The arguments object as JSON text (OpenAI's ``function.arguments``)."""


@dataclass(frozen=True)
class ContentPiece:
    text: str


@dataclass(frozen=True)
class CallPiece:
    index: int
    call: ToolCall


StreamPiece = ContentPiece | CallPiece


@dataclass(frozen=True)
class ParsedReply:
    content: str | None
    """The text besides the calls (None when there is none and a call was made)."""
    calls: tuple[ToolCall, ...]


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def read_call(text: str, names: Sequence[str], fmt: ToolFormat, new_id: Callable[[], str]) -> ToolCall | None:
    """The call one JSON object writes, or None if it is not a call of one of ``names``."""
    try:
        value = json.loads(text, strict=False)  # a raw control character in a string is still the text meant
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get(fmt.arguments_key, value.get("arguments", value.get("parameters")))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments, strict=False)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(new_id(), str(value["name"]), json.dumps(arguments, ensure_ascii=False))


class ToolStreamParser:
    """Incremental parsing of one choice's text: push text as it comes, then ``finish``."""

    def __init__(self, plan: ToolPlan, new_id: Callable[[], str] = new_call_id) -> None:
        self._format = plan.format
        self._names = [function.name for function in plan.functions]
        self._several = plan.several_calls
        self._new_id = new_id
        self._buffer = ""
        self._pending = ""
        """Whitespace that ended the content so far: sent only if more content follows."""
        self._inside = False
        self._plain = False
        """LLAMA3_JSON only: the reply was found not to be a call; everything is content now."""
        self.calls = 0

    def push(self, text: str) -> list[StreamPiece]:
        self._buffer += text
        if not self._format.open_tag:
            return self._push_bare()
        pieces: list[StreamPiece] = []
        while True:
            if self._inside:
                end = self._buffer.find(self._format.close_tag)
                if end < 0:
                    return pieces
                body, self._buffer = self._buffer[:end], self._buffer[end + len(self._format.close_tag) :]
                self._inside = False
                pieces += self._closed(body, closed=True)
                continue
            start = self._buffer.find(self._format.open_tag)
            if start < 0:
                keep = _held_prefix(self._buffer, self._format.open_tag)
                pieces += self._content(self._buffer[: len(self._buffer) - keep])
                self._buffer = self._buffer[len(self._buffer) - keep :]
                return pieces
            pieces += self._content(self._buffer[:start])
            self._buffer, self._inside, self._pending = self._buffer[start + len(self._format.open_tag) :], True, ""

    def finish(self) -> list[StreamPiece]:
        """What is still held back once the text ends (an unclosed last call is read as a call)."""
        rest, self._buffer = self._buffer, ""
        if not self._format.open_tag:
            pieces = self._bare_end(rest)
        elif self._inside:
            self._inside = False
            pieces = self._closed(rest, closed=False)
        elif self.calls and self._format.open_tag.startswith(rest.lstrip()):
            pieces = []  # a further call cut short inside its opening tag
        else:
            pieces = self._content(rest)
        pending, self._pending = self._pending, ""
        return pieces if self.calls or not pending else [*pieces, ContentPiece(pending)]

    def _content(self, text: str) -> list[StreamPiece]:
        text = self._pending + text
        shown = text.rstrip()
        self._pending = text[len(shown) :]
        return [ContentPiece(shown)] if shown else []

    def _closed(self, body: str, *, closed: bool) -> list[StreamPiece]:
        call = read_call(body.strip(), self._names, self._format, self._new_id)
        if call is None and not closed:
            return []  # a call cut short (max_tokens, a stop string): neither a call nor content
        if call is None:
            return self._content(f"{self._format.open_tag}{body}{self._format.close_tag}")
        if self.calls and not self._several:
            return []  # one call was asked for: a further one is not reported
        self.calls += 1
        return [CallPiece(self.calls - 1, call)]

    def _push_bare(self) -> list[StreamPiece]:
        if self._plain:
            text, self._buffer = self._buffer, ""
            return self._content(text)
        head = self._buffer.lstrip()
        if head.startswith(PYTHON_TAG) or head.startswith("{") or PYTHON_TAG.startswith(head):
            return []  # may be a call: decided at the end
        self._plain = True
        return self._push_bare()

    def _bare_end(self, rest: str) -> list[StreamPiece]:
        if self._plain:
            return self._content(rest)
        body = rest.strip().removeprefix(PYTHON_TAG).strip()
        objects = _json_objects(body)
        trigger = self._format.trigger
        if body and not objects and body[: len(trigger)] == trigger[: len(body)]:
            return []  # a call cut short: neither a call nor content
        calls = [read_call(part, self._names, self._format, self._new_id) for part in objects]
        if not calls or any(call is None for call in calls):
            return self._content(rest)
        found = [call for call in calls if call is not None][: None if self._several else 1]
        self.calls = len(found)
        return [CallPiece(index, call) for index, call in enumerate(found)]


def _held_prefix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that starts ``tag`` (it may become the tag)."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


def _json_objects(text: str) -> list[str]:
    """``text`` cut into top-level JSON values separated by ``;`` or whitespace ([] if not so)."""
    decoder = json.JSONDecoder(strict=False)
    parts: list[str] = []
    cursor = 0
    while cursor < len(text):
        try:
            _, end = decoder.raw_decode(text, cursor)
        except json.JSONDecodeError:
            return []
        parts.append(text[cursor:end])
        cursor = end
        while cursor < len(text) and text[cursor] in " \t\r\n;":
            cursor += 1
    return parts


def parse_reply(text: str, plan: ToolPlan, new_id: Callable[[], str] = new_call_id) -> ParsedReply:
    """A whole reply's content and calls."""
    parser = ToolStreamParser(plan, new_id)
    pieces = [*parser.push(text), *parser.finish()]
    calls = tuple(piece.call for piece in pieces if isinstance(piece, CallPiece))
    content = "".join(piece.text for piece in pieces if isinstance(piece, ContentPiece))
    if calls or content != text:
        return ParsedReply(content or None, calls)
    return ParsedReply(content, ())
