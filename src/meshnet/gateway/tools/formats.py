"""How one family writes a tool call, chosen from its chat template.

Three formats, each a frozen value (what llama.cpp's common/chat.cpp calls a chat format):
- ``HERMES`` (Qwen2/Qwen2.5/Qwen3 and other Hermes-style templates): each call is
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``; several may follow each other.
- ``LLAMA3_JSON`` (Llama 3.1-3.3): the whole reply is one ``{"name": ..., "parameters": {...}}``
  object (after an optional ``<|python_tag|>``); the template allows one call per turn.
- ``GENERIC`` for templates that know nothing of tools: the tools are listed in a system
  preamble (``GENERIC_PREAMBLE``), calls use the Hermes tags, past calls and tool results are
  written into ordinary assistant / user turns as text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

FormatName = Literal["hermes", "llama3_json", "generic"]


@dataclass(frozen=True)
class ToolFormat:
    name: FormatName
    open_tag: str
    """Text that starts a call ("" when a call is a bare JSON object)."""
    close_tag: str
    arguments_key: str
    """The key of the arguments in the call object ("arguments" or "parameters")."""
    parallel: bool
    """Whether a turn may hold several calls."""
    template_renders_tools: bool
    """False: the tools and calls are written as text (``GENERIC``), not passed to the template."""
    trigger: str
    """The words that start a call: where the lazy grammar of ``tool_choice: auto`` engages."""

    def call_text(self, name: str, arguments: Mapping[str, Any]) -> str:
        """One call as the model writes it."""
        body = json.dumps({"name": name, self.arguments_key: arguments}, ensure_ascii=False)
        return f"{self.open_tag}\n{body}\n{self.close_tag}" if self.open_tag else body


TAGS = ("<tool_call>", "</tool_call>")
HERMES = ToolFormat("hermes", *TAGS, "arguments", parallel=True, template_renders_tools=True, trigger=TAGS[0])
LLAMA3_JSON = ToolFormat(
    "llama3_json", "", "", "parameters", parallel=False, template_renders_tools=True, trigger='{"name"'
)
GENERIC = ToolFormat("generic", *TAGS, "arguments", parallel=True, template_renders_tools=False, trigger=TAGS[0])

PYTHON_TAG = "<|python_tag|>"

GENERIC_PREAMBLE = (
    "You may call functions to answer. To call one, reply with\n"
    '<tool_call>\n{"name": <function name>, "arguments": <arguments as a JSON object>}\n</tool_call>\n'
    "The functions:\n"
)


def choose_format(template_source: str | None) -> ToolFormat:
    """The tool format a chat template speaks (pure: the template's text decides)."""
    source = template_source or ""
    if "tools" not in source:
        return GENERIC
    if "<tool_call>" in source:
        return HERMES
    if PYTHON_TAG in source or "ipython" in source:
        return LLAMA3_JSON
    return GENERIC


def generic_preamble(functions: Sequence[Mapping[str, Any]]) -> str:
    """The system text that lists the tools to a model whose template has no place for them."""
    return GENERIC_PREAMBLE + "\n".join(json.dumps(function, ensure_ascii=False) for function in functions)
