"""A request's tools, ``tool_choice`` and ``parallel_tool_calls``, checked into one frozen value.

Semantics (OpenAI's, decided here once):
- ``auto`` (the default when tools are given): the tools are rendered, the model may call them;
  its reply is parsed for calls, under a lazy grammar that engages once the model writes the
  family's call start (``ToolFormat.trigger``), as llama-server does (not with a
  ``response_format``, whose grammar then holds instead).
- ``required``: the reply is one or more calls (one if ``parallel_tool_calls`` is false or the
  family allows one per turn), constrained by a grammar; ``{"type": "function", ...}``: the same,
  limited to that function (one call). Not with ``stop``: the call's own text could end the reply.
- ``none``: the model must not call: the tools are not rendered and the reply is not parsed
  (past calls and tool results in the history are still rendered).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from meshnet.gateway.errors import bad_request
from meshnet.gateway.schemas import ChatCompletionBody, NamedToolChoice
from meshnet.gateway.tools.formats import ToolFormat, choose_format

ChoiceMode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class ToolFunction:
    name: str
    description: str | None
    parameters_json: str
    """The arguments' JSON schema as JSON text (a value, so the plan stays frozen)."""

    @property
    def parameters(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.parameters_json)
        return loaded

    def openai_json(self) -> dict[str, Any]:
        """The function as OpenAI's ``tools`` entry spells it (what chat templates expect)."""
        described = {} if self.description is None else {"description": self.description}
        return {"name": self.name, **described, "parameters": self.parameters}


@dataclass(frozen=True)
class ToolPlan:
    functions: tuple[ToolFunction, ...]
    mode: ChoiceMode
    forced_name: str | None
    """The function ``tool_choice`` names (mode ``named``)."""
    parallel: bool
    """``parallel_tool_calls``: several calls in one turn (if the family allows it)."""
    format: ToolFormat
    lazy_grammar: bool = False
    """``auto`` with no ``response_format``: a call, once started, follows the call grammar."""

    @property
    def grammar(self) -> bool:
        """The reply runs under the tool-call grammar (whole, or lazily from a call's start)."""
        return self.constrained or self.lazy_grammar

    @property
    def active(self) -> bool:
        """Tools are rendered and the reply is parsed for calls."""
        return self.mode != "none" and bool(self.functions)

    @property
    def constrained(self) -> bool:
        return self.mode in ("required", "named")

    @property
    def several_calls(self) -> bool:
        """Several calls in one turn: asked for, allowed by the family, and not a named choice
        (OpenAI's named choice is one call of that function)."""
        return self.parallel and self.format.parallel and self.mode != "named"

    def callable_functions(self) -> tuple[ToolFunction, ...]:
        """The functions the reply may call."""
        if self.mode == "named":
            return tuple(function for function in self.functions if function.name == self.forced_name)
        return self.functions if self.active else ()


def read_tool_plan(body: ChatCompletionBody, template_source: str | None) -> ToolPlan | None:
    """The request's tool plan; None when it has no tools, no tool choice and no tool history."""
    history = any(message.tool_calls or message.role == "tool" for message in body.messages)
    tools = body.tools or []
    if not tools and body.tool_choice in (None, "none") and not history:
        return None
    functions = tuple(_function(index, tool.function) for index, tool in enumerate(body.tools or []))
    names = [function.name for function in functions]
    duplicate = next((name for name in names if names.count(name) > 1), None)
    if duplicate is not None:
        raise bad_request("invalid_parameter", f"tools name the function {duplicate!r} twice", "tools")
    mode, forced = _choice(body.tool_choice, bool(functions), names)
    if mode in ("required", "named") and body.response_format is not None and body.response_format.type != "text":
        raise bad_request(
            "invalid_parameter",
            "a required or named tool_choice cannot be combined with response_format",
            "tool_choice",
        )
    if mode in ("required", "named") and body.stop:
        raise bad_request(
            "invalid_parameter",
            "stop cannot be combined with a required or named tool_choice: the call's own text could end the reply",
            "stop",
        )
    parallel = True if body.parallel_tool_calls is None else body.parallel_tool_calls
    free_format = body.response_format is None or body.response_format.type == "text"
    lazy = mode == "auto" and bool(functions) and free_format
    return ToolPlan(functions, mode, forced, parallel, choose_format(template_source), lazy)


def _function(index: int, function: Any) -> ToolFunction:
    parameters: Mapping[str, Any] = function.parameters or {"type": "object", "properties": {}}
    kind = parameters.get("type", "object")
    if kind != "object":
        raise bad_request(
            "invalid_parameter",
            f"the parameters of {function.name!r} must be the JSON schema of an object, not of {kind!r}",
            f"tools.{index}.function.parameters",
        )
    return ToolFunction(function.name, function.description, json.dumps(parameters))


def _choice(choice: str | NamedToolChoice | None, has_tools: bool, names: list[str]) -> tuple[ChoiceMode, str | None]:
    if choice is None:
        return ("auto" if has_tools else "none"), None
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            listing = ", ".join(names) or "none"
            raise bad_request(
                "invalid_parameter",
                f"tool_choice names the function {choice.function.name!r}, which tools do not define ({listing})",
                "tool_choice",
            )
        return "named", choice.function.name
    if choice in ("auto", "required") and not has_tools:
        raise bad_request("invalid_parameter", f"tool_choice {choice!r} needs tools", "tool_choice")
    mode: ChoiceMode = "auto" if choice == "auto" else "required" if choice == "required" else "none"
    return mode, None
