"""The Responses request body, and its pure translation into the chat request the route serves.

Stored responses are off: ``store: true`` and ``previous_response_id`` are refused with a 400
that says why (OpenAI's default for an absent ``store`` is true; here absent means false).
Function tools are the chat tools (gateway/tools) in Responses' flatter spelling: ``tools``
entries of type ``function``, ``tool_choice``, ``parallel_tool_calls``, and ``function_call`` /
``function_call_output`` input items for the calls and results of earlier turns. Other tool
types and other known parameters that would change the answer are accepted only at their neutral
value, as ``schemas.UNSUPPORTED`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from meshnet.gateway.errors import bad_request
from meshnet.gateway.prepare import joined_text
from meshnet.gateway.schemas import (
    CalledFunction,
    ChatCompletionBody,
    ChatMessage,
    FunctionDef,
    JsonSchemaFormat,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    ToolCallIn,
    ToolDef,
    is_none_or,
)

InputRole = Literal["user", "system", "developer", "assistant"]
ChoiceWord = Literal["none", "auto", "required"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class InputPart(_Body):
    type: str
    text: str | None = None


class InputItem(_Body):
    type: str = "message"
    role: InputRole | None = None
    content: str | list[InputPart] | None = None
    call_id: str | None = Field(default=None, min_length=1, max_length=256)
    """``function_call`` and ``function_call_output`` items: the call."""
    name: str | None = None
    arguments: str | None = None
    output: str | None = None


class FunctionTool(_Body):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, JsonValue] | None = None
    strict: bool | None = None


class FunctionChoice(_Body):
    type: Literal["function"]
    name: str


class TextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    name: str = Field(default="response", min_length=1, max_length=64)
    schema_: dict[str, JsonValue] = Field(default_factory=dict, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(_Body):
    format: TextFormat | None = None


class ResponsesBody(_Body):
    model: str = Field(min_length=1, max_length=256)
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    text: TextConfig | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ChoiceWord | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning: JsonValue = None
    background: JsonValue = None
    conversation: JsonValue = None
    prompt: JsonValue = None
    top_logprobs: JsonValue = None
    include: JsonValue = None


UNSUPPORTED: Mapping[str, Callable[[JsonValue], bool]] = MappingProxyType(
    {
        "reasoning": is_none_or(),
        "background": is_none_or(False),
        "conversation": is_none_or(),
        "prompt": is_none_or(),
        "top_logprobs": is_none_or(0),
        "include": is_none_or([]),
    }
)
"""Known Responses parameters this gateway does not implement, each with its neutral value."""


def check_supported(body: ResponsesBody) -> None:
    """400 for what this server cannot honour as asked: stored responses, tools, the rest."""
    if body.store:
        raise bad_request(
            "unsupported_parameter",
            "store: true is not supported: this gateway keeps no responses (send store: false)",
            "store",
        )
    if body.previous_response_id is not None:
        raise bad_request(
            "unsupported_parameter",
            "previous_response_id is not supported: stored responses are off, so send the whole conversation in input",
            "previous_response_id",
        )
    for index, tool in enumerate(body.tools or []):
        if tool.type != "function" or tool.name is None:
            raise bad_request(
                "unsupported_parameter",
                f"tools of type {tool.type!r} are not supported; only named function tools are",
                f"tools.{index}",
            )
    for name, is_neutral in UNSUPPORTED.items():
        if not is_neutral(getattr(body, name)):
            raise bad_request(
                "unsupported_parameter", f"{name} is not supported by this server with the value given", name
            )


def chat_body(body: ResponsesBody) -> ChatCompletionBody:
    """The chat completion request that answers ``body`` (after ``check_supported``)."""
    messages: list[ChatMessage] = []
    if body.instructions is not None:
        messages.append(ChatMessage(role="system", content=body.instructions))
    if isinstance(body.input, str):
        messages.append(ChatMessage(role="user", content=body.input))
    else:
        for index, item in enumerate(body.input):
            _add_item(messages, index, item)
    if not messages:
        raise bad_request("invalid_parameter", "input holds no message", "input")
    return ChatCompletionBody(
        model=body.model,
        messages=messages,
        max_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        stream=body.stream,
        response_format=_response_format(body.text),
        tools=None if body.tools is None else [_chat_tool(tool) for tool in body.tools],
        tool_choice=_chat_tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls,
    )


def _chat_tool(tool: FunctionTool) -> ToolDef:
    function = FunctionDef(
        name=tool.name or "", description=tool.description, parameters=tool.parameters, strict=tool.strict
    )
    return ToolDef(type="function", function=function)


def _chat_tool_choice(choice: ChoiceWord | FunctionChoice | None) -> ChoiceWord | NamedToolChoice | None:
    if isinstance(choice, FunctionChoice):
        return NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
    return choice


def _add_item(messages: list[ChatMessage], index: int, item: InputItem) -> None:
    """Append ``item`` as chat messages; consecutive calls become one assistant turn's calls."""
    param = f"input.{index}"
    if item.type == "function_call":
        if item.call_id is None or item.name is None or item.arguments is None:
            raise bad_request("invalid_parameter", "a function_call item needs call_id, name and arguments", param)
        call = ToolCallIn(id=item.call_id, function=CalledFunction(name=item.name, arguments=item.arguments))
        last = messages[-1] if messages else None
        if last is not None and last.role == "assistant" and last.tool_calls and not last.content:
            messages[-1] = ChatMessage(role="assistant", tool_calls=[*last.tool_calls, call])
        else:
            messages.append(ChatMessage(role="assistant", tool_calls=[call]))
        return
    if item.type == "function_call_output":
        if item.call_id is None or item.output is None:
            raise bad_request("invalid_parameter", "a function_call_output item needs call_id and output", param)
        messages.append(ChatMessage(role="tool", tool_call_id=item.call_id, content=item.output))
        return
    messages.append(_message(index, item))


def _message(index: int, item: InputItem) -> ChatMessage:
    param = f"input.{index}"
    if item.type != "message":
        raise bad_request(
            "unsupported_parameter", f"input items of type {item.type!r} are not supported here", f"{param}.type"
        )
    if item.role is None or item.content is None:
        raise bad_request("invalid_parameter", "a message item needs a role and content", param)
    if isinstance(item.content, str):
        return ChatMessage(role=item.role, content=item.content)
    return ChatMessage(
        role=item.role, content=joined_text(item.content, ("input_text", "output_text"), f"{param}.content")
    )


def _response_format(text: TextConfig | None) -> ResponseFormat | None:
    wanted = None if text is None else text.format
    if wanted is None or wanted.type != "json_schema":
        return None if wanted is None else ResponseFormat(type=wanted.type)
    schema = JsonSchemaFormat.model_validate(
        {"name": wanted.name, "schema": wanted.schema_, "description": wanted.description, "strict": wanted.strict}
    )
    return ResponseFormat(type="json_schema", json_schema=schema)


def text_config(body: ResponsesBody) -> dict[str, JsonValue]:
    """The ``text`` field of the response object: the format the request asked for."""
    wanted = None if body.text is None else body.text.format
    if wanted is None or wanted.type != "json_schema":
        return {"format": {"type": "text" if wanted is None else wanted.type}}
    shown: dict[str, JsonValue] = {"type": "json_schema", "name": wanted.name, "schema": wanted.schema_}
    if wanted.description is not None:
        shown["description"] = wanted.description
    shown["strict"] = wanted.strict
    return {"format": shown}


def tools_json(body: ResponsesBody) -> list[dict[str, JsonValue]]:
    """The ``tools`` field of the response object: the request's function tools."""
    return [
        {
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
            "strict": tool.strict,
        }
        for tool in body.tools or []
    ]


def tool_choice_json(body: ResponsesBody) -> JsonValue:
    """The ``tool_choice`` field of the response object (OpenAI's default: auto with tools)."""
    choice = body.tool_choice
    if isinstance(choice, FunctionChoice):
        return {"type": "function", "name": choice.name}
    return choice or ("auto" if body.tools else "none")
