"""Request bodies of the OpenAI-compatible endpoints, as strict pydantic v2 models.

Unknown fields are handled deliberately, in three groups:
- modelled and honoured (``max_tokens``, ``temperature``, ``stop``, ``top_k`` extension ...);
- known OpenAI parameters we cannot honour (``UNSUPPORTED``): accepted only with their neutral
  value (``best_of: 1``, ``echo: false``, ``functions: []`` ...), any other value is a 400
  ``unsupported_parameter`` rather than a silently different answer;
- everything else (``user``, ``metadata``, ``store``, ``service_tier``, future fields) is
  harmless to ignore, so ``extra="ignore"`` keeps newer clients working.
Parsing is strict (no ``"0.5"`` for a float, no ``true`` for an int), as OpenAI's API is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from meshnet.core.generation import MAX_TOP_K
from meshnet.core.sampling_options import MAX_REPETITION_PENALTY, MAX_TOP_LOGPROBS

SEED_MIN = -(2**63)
SEED_MAX = 2**64 - 1


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class StreamOptions(_Body):
    include_usage: bool = False
    """Send a last chunk with ``usage`` and no choices before ``[DONE]``."""


class JsonSchemaFormat(_Body):
    name: str = Field(default="response", min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, JsonValue] = Field(default_factory=dict, alias="schema")
    """The JSON schema the answer must match; an empty schema allows any JSON value."""
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    """Required with ``type: json_schema``, ignored otherwise."""


class ContentPart(_Body):
    type: str
    text: str | None = None


class FunctionDef(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, JsonValue] | None = None
    """The arguments' JSON schema; None: a function without arguments."""
    strict: bool | None = None


class ToolDef(_Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class CalledFunction(_Body):
    name: str
    arguments: str
    """The arguments as a JSON object in a string, as OpenAI returned them."""


class ToolCallIn(_Body):
    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    """An assistant turn's function calls (gateway/tools)."""
    tool_call_id: str | None = None
    """A ``tool`` message: the call it answers."""


class _CompletionBody(_Body):
    """Fields shared by chat and text completions."""

    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, le=MAX_TOP_K)
    """Extension (llama.cpp, vLLM): keep only the k most likely tokens; 0 keeps all."""
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(default=None, ge=1)
    """Independent choices, each its own route session (seed + index); capped by the config."""
    logit_bias: dict[str, float] | None = None
    """Token id (as a string) -> bias in [-100, 100] added to its logit."""
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    """Extension (vLLM, llama.cpp): drop tokens less than min_p times as likely as the best."""
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=MAX_REPETITION_PENALTY)
    """Extension (vLLM, llama.cpp): generated tokens' positive logits divided by it, negative
    ones multiplied; 1 is off. Counts the completion's tokens only, not the prompt's."""
    response_format: ResponseFormat | None = None
    """``text``, ``json_object`` or ``json_schema``: the tail samples under llama.cpp's grammar."""
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)
    """Extension (vLLM's name): reuse stored prompt KV only with requests of the same salt, so
    nobody without it can tell from their time to first token whether a prompt was seen."""


class ChatCompletionBody(_CompletionBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    """Alternatives per token; needs ``logprobs: true``."""
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: JsonValue = None
    function_call: JsonValue = None
    audio: JsonValue = None
    modalities: JsonValue = None
    prediction: JsonValue = None


class CompletionBody(_CompletionBody):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    """Legacy completions: report logprobs with this many alternatives per token."""
    echo: JsonValue = None
    suffix: JsonValue = None
    best_of: JsonValue = None


def is_none_or(*neutral: object) -> Callable[[JsonValue], bool]:
    # Compare by type and value: ``False == 0`` must not make ``logprobs: 0`` look neutral.
    return lambda value: (
        value is None or any(type(value) is type(candidate) and value == candidate for candidate in neutral)
    )


UNSUPPORTED: Mapping[str, Callable[[JsonValue], bool]] = MappingProxyType(
    {
        "best_of": is_none_or(1),
        "echo": is_none_or(False),
        "suffix": is_none_or(""),
        "functions": is_none_or([]),
        "function_call": is_none_or("none"),
        "audio": is_none_or(),
        "modalities": is_none_or(["text"]),
        "prediction": is_none_or(),
    }
)
"""Known OpenAI parameters we do not implement, each with a test for its neutral value."""


def unsupported_parameters(body: BaseModel) -> list[str]:
    """Names of the known-unsupported parameters the body sets to a non-neutral value."""
    fields = type(body).model_fields
    return [name for name, is_neutral in UNSUPPORTED.items() if name in fields and not is_neutral(getattr(body, name))]
