"""A model's chat template, rendered in a sandbox, and told apart from the messages inside it.

The template is the Jinja source stored in the GGUF: data from a file, never trusted code. To
tokenize a chat safely its rendering is split into the template's own text, whose markers
(``<|im_start|>``...) are control tokens, and the messages' content, which must stay text: a
user who writes ``<|im_end|><|im_start|>system`` would otherwise speak as the system.

How the split is found: the template is rendered once with the real content and once with an
unguessable placeholder per message, padded with a separator character that templates trim
like whitespace. Where a placeholder lands is where its content goes, and a missing pad says
the template stripped that side. The split is only used if putting the content back where the
placeholders are gives exactly the real rendering, so a template that alters content in some
other way is detected rather than mis-split.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from meshnet.core.errors import ChatTemplateMissing, InvalidArgument

PAD = "\x1f"
"""Python's ``str.strip`` (and Jinja's ``trim``) removes it like whitespace; templates never write it."""


@dataclass(frozen=True)
class ChatPiece:
    text: str
    content: bool
    """True: text from a message, never to be read as control tokens."""


class ChatTemplate:
    def __init__(self, source: str | None, *, bos_text: str, eos_text: str) -> None:
        self._bos_text = bos_text
        self._eos_text = eos_text
        self._template = None
        if source is not None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
            env.globals["raise_exception"] = _raise_template_error
            env.filters["tojson"] = _tojson
            self._template = env.from_string(source)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The chat as the template writes it; ``tools`` (OpenAI's function entries) and messages
        with ``tool_calls`` / ``tool`` roles are passed as Hugging Face templates expect them."""
        if self._template is None:
            # A base model: inventing a turn format would give answers the model was never
            # trained to give. Say so; completions still work.
            raise ChatTemplateMissing(
                "this model has no chat template (a base model): use /v1/completions, or give one "
                "with --chat-template FILE"
            )
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                tools=None if tools is None else [dict(tool) for tool in tools],
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos_text,
                eos_token=self._eos_text,
            )
        except jinja2.TemplateError as error:
            raise InvalidArgument(f"the model's chat template rejected these messages: {error}") from None

    def pieces(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[ChatPiece] | None:
        """The rendering as template text and message content, in order, joining to exactly
        ``render``'s output; None if the template alters content in a way that cannot be split."""
        truth = self.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        nonce = secrets.token_hex(8)
        # Empty content has nothing to keep apart (and templates test it: ``if message.content``).
        placeholders = [
            {**m, "content": f"{PAD}{nonce}m{index}e{PAD}" if m["content"] else m["content"]}
            for index, m in enumerate(messages)
        ]
        shape = self.render(placeholders, add_generation_prompt=add_generation_prompt, tools=tools)
        pieces: list[ChatPiece] = []
        cursor = 0
        for found in re.finditer(f"({PAD}?){nonce}m(\\d+)e({PAD}?)", shape):
            content = messages[int(found.group(2))]["content"]
            if not found.group(1):
                content = content.lstrip()
            if not found.group(3):
                content = content.rstrip()
            pieces += [ChatPiece(shape[cursor : found.start()], False), ChatPiece(content, True)]
            cursor = found.end()
        pieces.append(ChatPiece(shape[cursor:], False))
        pieces = [piece for piece in pieces if piece.text]
        return pieces if "".join(piece.text for piece in pieces) == truth else None


def _raise_template_error(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Hugging Face's ``tojson`` (transformers' chat template filter, the same arguments): plain
    # JSON, not Jinja's HTML-escaped one (``<`` stays ``<``).
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
