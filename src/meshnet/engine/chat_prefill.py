"""Assistant prefill: a chat whose last message is the assistant's own start, to be continued.

The prompt is the chat rendered without a generation prompt and cut right after the last
message's content, so no end-of-turn follows it (vLLM's ``continue_final_message``, what
llama-server does with a trailing assistant message). The cut is used only when it equals the
chat without that message, rendered with the generation prompt, followed by the message's
content: then the model sees exactly the turn it would have opened, already begun. A template
that renders the final assistant turn any other way (it rewrites the content, writes a
thinking block, or opens the turn differently from its generation prompt) is refused rather than
guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from meshnet.core.errors import InvalidArgument
from meshnet.engine.chat_template import ChatPiece, ChatTemplate


def continuation_pieces(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[ChatPiece]:
    """The pieces of the prompt that continues the final (assistant) message of ``messages``."""
    if not messages or messages[-1].get("role") != "assistant":
        raise InvalidArgument("a continued chat must end with an assistant message")
    earlier = messages[:-1]
    if not earlier:
        raise InvalidArgument("an assistant message can be continued only after an earlier message")
    if messages[-1].get("tool_calls"):
        raise InvalidArgument(
            "the final assistant message calls tools: send each call's result as a tool message "
            "after it, rather than asking for the message to be continued"
        )
    content = str(messages[-1].get("content") or "")
    opened = template.pieces(earlier, add_generation_prompt=True, tools=tools)
    if opened is None:
        raise _cannot_continue()
    if not content:
        return opened  # nothing begun yet: the turn the generation prompt opens
    whole = template.pieces(messages, add_generation_prompt=False, tools=tools)
    last = None if whole is None else max((i for i, piece in enumerate(whole) if piece.content), default=None)
    if whole is None or last is None:
        raise _cannot_continue()
    cut = whole[: last + 1]
    expected = "".join(piece.text for piece in opened) + whole[last].text
    if "".join(piece.text for piece in cut) != expected or whole[last].text.strip() != content.strip():
        raise _cannot_continue()
    return cut


def _cannot_continue() -> InvalidArgument:
    return InvalidArgument(
        "this model's chat template renders a final assistant message differently from the turn "
        "it opens for a reply, so the message cannot be continued (assistant prefill); send it "
        "without the trailing assistant message"
    )
