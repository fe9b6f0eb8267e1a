"""Function tools in ``client.responses.create`` on a real 3-way swarm of a synthetic Qwen-family
model (Qwen2.5's template, trimmed): the Responses call equals the chat completions call on the
same swarm (both greedy, both through gateway/tools), its arguments validate against the schema,
and the round trip (``function_call`` + ``function_call_output`` items) answers what chat answers
for the same turns, streamed and not.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from swarm_harness import MODEL_NAME, Swarm

from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.artifact.synthetic_templates import QWEN_TOOL_TEMPLATE

pytestmark = pytest.mark.timeout(600)

PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
RESPONSES_TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "parameters": PARAMETERS}]
CHAT_TOOLS: list[Any] = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}]
QUESTION = "What is the weather in Paris?"
GREEDY: dict[str, Any] = {"temperature": 0, "parallel_tool_calls": False}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    folder = tmp_path_factory.mktemp("qwen")
    spec = SyntheticSpec(architecture="qwen2", n_layers=4, chat_template=QWEN_TOOL_TEMPLATE, seed=3)
    model: Path = write_synthetic_model(folder / "qwen2.gguf", spec)
    with Swarm(tmp_path_factory.mktemp("swarm"), model) as swarm:
        swarm.start_tracker()
        swarm.start_workers("0:2", "2:3", "3:4", n_ctx_per_session=2048)
        base_url = swarm.start_gateway()
        swarm.wait_routable(nodes=3)
        with openai.OpenAI(base_url=f"{base_url}/v1", api_key=swarm.api_key, max_retries=0, timeout=120.0) as api:
            yield api


def test_required_call_equals_the_chat_call_and_validates(client: openai.OpenAI) -> None:
    reply = client.responses.create(
        model=MODEL_NAME, input=QUESTION, tools=RESPONSES_TOOLS, tool_choice="required", max_output_tokens=120, **GREEDY
    )
    chat = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": QUESTION}],
        tools=CHAT_TOOLS,
        tool_choice="required",
        max_tokens=120,
        **GREEDY,
    )
    calls = [item for item in reply.output if item.type == "function_call"]
    chat_calls = chat.choices[0].message.tool_calls or []
    assert len(calls) == len(chat_calls) == 1
    call: Any = calls[0]
    assert call.name == "get_weather" == chat_calls[0].function.name  # type: ignore[union-attr]
    assert call.arguments == chat_calls[0].function.arguments  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.arguments), PARAMETERS)


def test_round_trip_answers_what_chat_answers(client: openai.OpenAI) -> None:
    arguments = '{"city": "Paris", "days": 1}'
    items: list[Any] = [
        {"role": "user", "content": QUESTION},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": arguments},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"},
    ]
    messages: list[Any] = [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    common: dict[str, Any] = {"model": MODEL_NAME, "tool_choice": "none", **GREEDY}
    whole = client.responses.create(input=items, tools=RESPONSES_TOOLS, max_output_tokens=24, **common)
    chat = client.chat.completions.create(messages=messages, tools=CHAT_TOOLS, max_tokens=24, **common)
    assert whole.output_text == chat.choices[0].message.content
    assert whole.usage is not None and chat.usage is not None
    assert whole.usage.input_tokens == chat.usage.prompt_tokens
    with client.responses.stream(input=items, tools=RESPONSES_TOOLS, max_output_tokens=24, **common) as stream:
        ended: Any = list(stream)[-1]  # response.incomplete when cut: no get_final_response() (openai-python#3538)
    assert ended.response.output_text == whole.output_text
