"""Tools / function calling with the official ``openai`` client, on real swarms of synthetic models.

A Qwen-family model (Qwen2.5's template, trimmed: ``<tool_call>`` tags) served whole and split in
two, and a Llama-family model (Llama 3.1's template: a bare ``{"name", "parameters"}`` object)
split in two; tracker, llama.cpp worker processes and gateway run as real processes. The models
have random weights, so only a grammar makes them call: with ``tool_choice`` required (or a
named function) every call must parse and validate against the function's schema (50 of 50),
the client's tool round trip must work streamed and not, and the split must call exactly what
the whole model calls.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pydantic
import pytest
from swarm_harness import MODEL_NAME, Swarm

from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.artifact.synthetic_templates import LLAMA3_TOOL_TEMPLATE, QWEN_TOOL_TEMPLATE

pytestmark = pytest.mark.timeout(600)

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The forecast", "parameters": WEATHER_PARAMETERS},
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
CONTEXT = 2048
QUESTION: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]


def _client(swarm: Swarm, ranges: tuple[str, ...]) -> openai.OpenAI:
    swarm.start_tracker()
    swarm.start_workers(*ranges, n_ctx_per_session=CONTEXT)  # the template's tool block is ~900 tokens
    base_url = swarm.start_gateway()
    swarm.wait_routable(nodes=len(ranges))
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=swarm.api_key, max_retries=0, timeout=120.0)


def _model(folder: Path, architecture: str, template: str) -> Path:
    spec = SyntheticSpec(architecture=architecture, n_layers=4, chat_template=template, seed=3)
    return write_synthetic_model(folder / f"{architecture}.gguf", spec)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _model(tmp_path_factory.mktemp("qwen"), "qwen2", QWEN_TOOL_TEMPLATE)


@pytest.fixture(scope="module")
def qwen_split(tmp_path_factory: pytest.TempPathFactory, qwen: Path) -> Iterator[openai.OpenAI]:
    with Swarm(tmp_path_factory.mktemp("qwen-split"), qwen) as swarm, _client(swarm, ("0:2", "2:4")) as client:
        yield client


def _required(client: openai.OpenAI, seed: int, **extra: Any) -> Any:
    fields: dict[str, Any] = {"tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 160, **extra}
    return client.chat.completions.create(
        model=MODEL_NAME, messages=QUESTION, tools=TOOLS, temperature=1.0, seed=seed, **fields
    )


def _checked_calls(message: Any) -> list[tuple[str, dict[str, Any]]]:
    """Each call's name and arguments, the arguments validated against the function's schema."""
    calls = []
    for call in message.tool_calls or []:
        arguments = json.loads(call.function.arguments)
        schema = next(
            tool["function"]["parameters"] for tool in TOOLS if tool["function"]["name"] == call.function.name
        )
        jsonschema.validate(arguments, schema)
        assert call.id.startswith("call_") and call.type == "function"
        calls.append((call.function.name, arguments))
    return calls


def test_required_calls_parse_and_validate_50_of_50(qwen_split: openai.OpenAI) -> None:
    valid = 0
    for seed in range(50):
        reply = _required(qwen_split, seed)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert len(_checked_calls(choice.message)) == 1
        assert choice.message.content is None  # the call never leaks into content
        valid += 1
    assert valid == 50


def test_named_function_and_parallel_calls(qwen_split: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    reply = _required(qwen_split, 1, tool_choice=named)
    assert [name for name, _ in _checked_calls(reply.choices[0].message)] == ["get_time"]
    several = [
        _checked_calls(_required(qwen_split, seed, parallel_tool_calls=True).choices[0].message) for seed in range(8)
    ]
    assert all(calls for calls in several)


def test_the_tool_round_trip_streamed_and_not(qwen_split: openai.OpenAI) -> None:
    reply = _required(qwen_split, 5)
    message = reply.choices[0].message
    with qwen_split.chat.completions.stream(
        model=MODEL_NAME,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=160,
        temperature=1.0,
        seed=5,
    ) as stream:
        streamed = stream.get_final_completion()
    assert streamed.choices[0].finish_reason == "tool_calls"
    assert _checked_calls(streamed.choices[0].message) == _checked_calls(message)
    (call,) = message.tool_calls or []
    history: list[Any] = [
        *QUESTION,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sunny", "celsius": 21}'},
    ]
    final = qwen_split.chat.completions.create(model=MODEL_NAME, messages=history, tools=TOOLS, max_tokens=8, seed=1)
    assert final.choices[0].message.tool_calls is None and isinstance(final.choices[0].message.content, str)
    chunks = list(
        qwen_split.chat.completions.create(
            model=MODEL_NAME, messages=history, tools=TOOLS, max_tokens=8, seed=1, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == final.choices[0].message.content


def test_tool_requests_the_server_cannot_serve_are_openai_400s(qwen_split: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as unknown:
        _required(qwen_split, 0, tool_choice={"type": "function", "function": {"name": "launch"}})
    assert unknown.value.code == "invalid_parameter" and unknown.value.param == "tool_choice"
    orphan = [*QUESTION, {"role": "tool", "tool_call_id": "call_none", "content": "1"}]
    with pytest.raises(openai.BadRequestError) as refused:
        qwen_split.chat.completions.create(model=MODEL_NAME, messages=orphan, tools=TOOLS, max_tokens=4)
    assert refused.value.param == "messages.1.tool_call_id"


def test_the_split_calls_exactly_what_the_whole_model_calls(
    tmp_path_factory: pytest.TempPathFactory, qwen: Path, qwen_split: openai.OpenAI
) -> None:
    with Swarm(tmp_path_factory.mktemp("qwen-whole"), qwen) as swarm, _client(swarm, ("0:4",)) as whole:
        for seed in (11, 12, 13):
            expected = _checked_calls(_required(whole, seed, parallel_tool_calls=True).choices[0].message)
            assert _checked_calls(_required(qwen_split, seed, parallel_tool_calls=True).choices[0].message) == expected


def test_a_llama_family_model_calls_in_its_own_format(tmp_path_factory: pytest.TempPathFactory) -> None:
    model = _model(tmp_path_factory.mktemp("llama"), "llama", LLAMA3_TOOL_TEMPLATE)
    with Swarm(tmp_path_factory.mktemp("llama-split"), model) as swarm, _client(swarm, ("0:2", "2:4")) as client:
        for seed in range(5):
            reply = _required(client, seed, parallel_tool_calls=True)  # Llama 3 allows one call per turn
            assert reply.choices[0].finish_reason == "tool_calls"
            assert len(_checked_calls(reply.choices[0].message)) == 1


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)
    country: str = pydantic.Field(max_length=8)


class Unit(StrEnum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Forecast(pydantic.BaseModel):
    """A nested model and an enum: pydantic_function_tool writes both as ``$defs`` + ``$ref``."""

    city: City
    unit: Unit
    days: int


def test_a_pydantic_tool_with_nested_models_is_called_and_parsed(qwen_split: openai.OpenAI) -> None:
    tool = openai.pydantic_function_tool(Forecast)
    assert "$defs" in tool["function"]["parameters"]
    for seed in range(3):
        reply = qwen_split.chat.completions.parse(
            model=MODEL_NAME,
            messages=QUESTION,
            tools=[tool],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=200,
            seed=seed,
        )
        (call,) = reply.choices[0].message.tool_calls or []
        assert isinstance(call.function.parsed_arguments, Forecast)  # the client's own validation
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    # tool_choice auto (the default) builds the same grammar lazily: no 400 either.
    auto = qwen_split.chat.completions.create(model=MODEL_NAME, messages=QUESTION, tools=[tool], max_tokens=16, seed=1)
    assert auto.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_a_call_cut_by_max_tokens_is_neither_content_nor_a_call(qwen_split: openai.OpenAI) -> None:
    cut = _required(qwen_split, 3, max_tokens=12)
    choice = cut.choices[0]
    assert (choice.finish_reason, choice.message.content, choice.message.tool_calls) == ("length", None, None)
    streamed = list(
        qwen_split.chat.completions.create(
            model=MODEL_NAME, messages=QUESTION, tools=TOOLS, tool_choice="required", max_tokens=12, seed=3, stream=True
        )
    )
    deltas = [chunk.choices[0].delta for chunk in streamed if chunk.choices]
    assert not any(delta.content or delta.tool_calls for delta in deltas)
    assert streamed[-1].choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as refused:
        _required(qwen_split, 3, stop=["\n"])
    assert refused.value.param == "stop"
