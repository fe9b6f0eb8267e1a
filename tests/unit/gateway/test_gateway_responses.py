"""``POST /v1/responses`` with the official openai client against a real uvicorn server: the
whole response, ``create(stream=True)`` with every event OpenAI sends in its order, the SDK's
``responses.stream`` helper, instructions and message items translated to the chat prompt, and
the typed 400s (stored responses, tools, parts we cannot read).

The route is the scripted double of ``gateway_doubles`` (its docstring says what it cannot
show); the same client against real workers, equal to the whole model and to chat completions:
tests/integration/test_swarm_responses.py.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from gateway_doubles import MODEL, ByteCodec, Script, ScriptedGenerator, live_server, make_app

from meshnet.gateway.ports import ModelCard
from meshnet.gateway.responses_api.body import ResponsesBody, chat_body, check_supported
from meshnet.gateway.schemas import ChatMessage

pytestmark = pytest.mark.timeout(30)

EVENT_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
]
CLOSING_ORDER = [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def client_for(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


def _chat_prompt(messages: list[dict[str, str]]) -> tuple[int, ...]:
    return tuple(ByteCodec().encode_chat(messages, add_generation_prompt=True))


async def test_whole_response_has_text_usage_and_the_request_id() -> None:
    generator = ScriptedGenerator()
    async with live_server(make_app(generator)) as base:
        reply = await client_for(base).responses.create(model=MODEL, input="hi", instructions="be brief")
    request, request_id = generator.requests[0]
    assert reply.id == request_id
    assert reply.object == "response" and reply.status == "completed"
    assert reply.output_text == "Hello world"
    asked = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert request.prompt_tokens == _chat_prompt(asked)
    assert reply.usage is not None
    assert reply.usage.input_tokens == len(request.prompt_tokens)
    assert reply.usage.output_tokens == len("Hello world") + 1  # + EOS, as the route counted
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens
    assert reply.store is False


async def test_streamed_events_come_in_openai_order_with_sequence_numbers() -> None:
    generator = ScriptedGenerator(Script(text="abc"))
    async with live_server(make_app(generator)) as base:
        stream = await client_for(base).responses.create(model=MODEL, input="hi", stream=True)
        events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert kinds == [*EVENT_ORDER, *["response.output_text.delta"] * 3, *CLOSING_ORDER]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(getattr(event, "delta", "") for event in events if event.type == "response.output_text.delta")
    final: Any = events[-1]
    assert deltas == "abc" == final.response.output_text
    assert final.response.usage.output_tokens == 4


async def test_the_sdk_stream_helper_assembles_the_final_response() -> None:
    generator = ScriptedGenerator()
    items: list[Any] = [
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "b"}]},
        {"role": "user", "content": "c"},
    ]
    async with (
        live_server(make_app(generator)) as base,
        client_for(base).responses.stream(model=MODEL, input=items) as stream,
    ):
        texts = [event.delta async for event in stream if event.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert "".join(texts) == final.output_text == "Hello world"
    request, _ = generator.requests[0]
    expected = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    assert request.prompt_tokens == _chat_prompt(expected)


async def test_max_output_tokens_makes_an_incomplete_response() -> None:
    generator = ScriptedGenerator()
    async with live_server(make_app(generator)) as base:
        reply = await client_for(base).responses.create(model=MODEL, input="hi", max_output_tokens=3)
    assert reply.status == "incomplete"
    assert reply.incomplete_details is not None and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.output_text == "Hel"
    assert generator.requests[0][0].max_tokens == 3


async def test_a_cut_stream_ends_with_response_incomplete_as_openai_ends_it() -> None:
    async with live_server(make_app(ScriptedGenerator())) as base:
        client = client_for(base)
        events = [
            event
            async for event in await client.responses.create(model=MODEL, input="hi", max_output_tokens=3, stream=True)
        ]
        async with client.responses.stream(model=MODEL, input="hi", max_output_tokens=3) as helper:
            helped = [event async for event in helper]
        async with client.responses.stream(model=MODEL, input="hi") as whole:
            finished = await whole.get_final_response()
    final: Any = events[-1]
    assert final.type == "response.incomplete" and "response.completed" not in [event.type for event in events]
    assert final.response.status == "incomplete" and final.response.output_text == "Hel"
    assert final.response.incomplete_details.reason == "max_output_tokens"
    last: Any = helped[-1]  # the SDK's helper types it and fills in the output it accumulated
    assert last.type == "response.incomplete" and last.response.output_text == "Hel"
    assert finished.status == "completed" and finished.output_text == "Hello world"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"store": True}, "store"),
        ({"previous_response_id": "resp-1"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tools.0"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input.0.content"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input.0.type"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input.0"),
        ({"input": []}, "input"),
    ],
)
async def test_what_cannot_be_honoured_is_a_typed_400(extra: dict[str, Any], param: str) -> None:
    generator = ScriptedGenerator()
    async with live_server(make_app(generator)) as base:
        with pytest.raises(openai.BadRequestError) as caught:
            await client_for(base).responses.create(**{"model": MODEL, "input": "hi", **extra})
    body: Any = caught.value.body
    assert body["param"] == param
    assert body["code"] in ("unsupported_parameter", "invalid_parameter")
    assert generator.requests == []


def test_store_false_and_absent_are_accepted_and_stored_responses_are_explained() -> None:
    check_supported(ResponsesBody.model_validate({"model": MODEL, "input": "x", "store": False}))
    check_supported(ResponsesBody.model_validate({"model": MODEL, "input": "x"}))
    with pytest.raises(Exception, match="keeps no responses"):
        check_supported(ResponsesBody.model_validate({"model": MODEL, "input": "x", "store": True}))


def test_text_format_json_schema_becomes_the_chat_response_format() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    body = ResponsesBody.model_validate(
        {
            "model": MODEL,
            "input": "x",
            "max_output_tokens": 9,
            "temperature": 0.5,
            "top_p": 0.9,
            "text": {"format": {"type": "json_schema", "name": "count", "schema": schema}},
        }
    )
    chat = chat_body(body)
    assert chat.messages == [ChatMessage(role="user", content="x")]
    assert (chat.max_tokens, chat.temperature, chat.top_p) == (9, 0.5, 0.9)
    assert chat.response_format is not None and chat.response_format.json_schema is not None
    assert chat.response_format.type == "json_schema"
    assert chat.response_format.json_schema.schema_ == schema
    assert chat.response_format.json_schema.name == "count"


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALLING = 'Sure<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
"""What the scripted model says: text, then one call in the generic (Hermes-tag) format."""


def tool_app(generator: ScriptedGenerator) -> Any:
    """The app over a double with room for the generic tools preamble (about 500 byte tokens)."""
    return make_app(generator, ByteCodec(context_length=2048))


def tool_generator(text: str = "Hello world") -> ScriptedGenerator:
    return ScriptedGenerator(Script(text=text), cards=(ModelCard(MODEL, "Q8_0", 2048),))


async def test_a_function_call_becomes_a_function_call_item() -> None:
    generator = tool_generator(CALLING)
    async with live_server(tool_app(generator)) as base:
        reply = await client_for(base).responses.create(model=MODEL, input="weather?", tools=[WEATHER])
    kinds = [item.type for item in reply.output]
    assert kinds == ["message", "function_call"]
    call: Any = reply.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_")
    assert reply.output_text == "Sure"
    assert reply.tools[0].name == "get_weather" and reply.tool_choice == "auto"


async def test_a_streamed_function_call_has_its_argument_events_and_equals_the_whole() -> None:
    generator = tool_generator(CALLING)
    async with live_server(tool_app(generator)) as base:
        client = client_for(base)
        whole = await client.responses.create(model=MODEL, input="weather?", tools=[WEATHER])
        stream = await client.responses.create(model=MODEL, input="weather?", tools=[WEATHER], stream=True)
        events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert kinds[-5:] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    final: Any = events[-1]
    streamed = final.response.output
    assert [item.type for item in streamed] == ["message", "function_call"]
    assert streamed[0].content[0].text == whole.output_text == "Sure"
    assert streamed[1].arguments == whole.output[1].arguments  # type: ignore[union-attr]


async def test_text_after_a_call_keeps_its_place_whole_and_streamed() -> None:
    # No whitespace after the call: how that is shown is the tools parser's rule (gateway/tools/parse.py).
    generator = tool_generator(CALLING + "Done.")
    async with live_server(tool_app(generator)) as base:
        client = client_for(base)
        whole = await client.responses.create(model=MODEL, input="weather?", tools=[WEATHER])
        stream = await client.responses.create(model=MODEL, input="weather?", tools=[WEATHER], stream=True)
        final: Any = [event async for event in stream][-1]

    def shown(output: Any) -> list[tuple[str, str]]:
        return [(item.type, item.content[0].text if item.type == "message" else item.name) for item in output]

    assert shown(whole.output) == shown(final.response.output)
    assert [kind for kind, _ in shown(whole.output)] == ["message", "function_call", "message"]
    assert shown(whole.output)[2][1] == "Done."


async def test_call_and_result_items_render_as_the_chat_tool_turns() -> None:
    generator = tool_generator()
    arguments = '{"city": "Paris"}'
    items: list[Any] = [
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": arguments},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]
    messages: list[Any] = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    chat_tool = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    async with live_server(tool_app(generator)) as base:
        client = client_for(base)
        await client.responses.create(model=MODEL, input=items, tools=[WEATHER])
        await client.chat.completions.create(model=MODEL, messages=messages, tools=[chat_tool])
    (responses_request, _), (chat_request, _) = generator.requests
    assert responses_request.prompt_tokens == chat_request.prompt_tokens
    assert b"sunny" in bytes(t - 2 for t in responses_request.prompt_tokens if t >= 2)
