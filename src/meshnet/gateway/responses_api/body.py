"""The Responses request body, and its pure translation into the chat request the route serves.

Stored responses are off: ``store: true`` and ``previous_response_id`` are refused with a 400
that says why (OpenAI's default for an absent ``store`` is true; here absent means false).
Tools are refused until the tools machinery serves them; other known parameters that would
change the answer are accepted only at their neutral value, as ``schemas.UNSUPPORTED`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from meshnet.gateway.errors import bad_request
from meshnet.gateway.schemas import ChatCompletionBody, ChatMessage, JsonSchemaFormat, ResponseFormat

InputRole = Literal["user", "system", "developer", "assistant"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class InputPart(_Body):
    type: str
    text: str | None = None


class InputItem(_Body):
    type: str = "message"
    role: InputRole | None = None
    content: str | list[InputPart] | None = None


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
    tools: JsonValue = None
    tool_choice: JsonValue = None
    reasoning: JsonValue = None
    background: JsonValue = None
    conversation: JsonValue = None
    prompt: JsonValue = None
    top_logprobs: JsonValue = None
    include: JsonValue = None


def _neutral(*values: object) -> Callable[[JsonValue], bool]:
    return lambda value: value is None or any(type(value) is type(v) and value == v for v in values)


UNSUPPORTED: Mapping[str, Callable[[JsonValue], bool]] = MappingProxyType(
    {
        "tools": _neutral([]),
        "tool_choice": _neutral("none", "auto"),
        "reasoning": _neutral(),
        "background": _neutral(False),
        "conversation": _neutral(),
        "prompt": _neutral(),
        "top_logprobs": _neutral(0),
        "include": _neutral([]),
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
        messages.extend(_message(index, item) for index, item in enumerate(body.input))
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
    )


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
    texts: list[str] = []
    for part in item.content:
        if part.type not in ("input_text", "output_text") or part.text is None:
            raise bad_request(
                "unsupported_parameter",
                f"content part of type {part.type!r} is unsupported; only input_text and output_text are",
                f"{param}.content",
            )
        texts.append(part.text)
    return ChatMessage(role=item.role, content="".join(texts))


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
