"""The official openai client against a real uvicorn server on 127.0.0.1: chat and completions,
streaming and not, stop sequences, usage, models, and typed errors raised in the client.

The route behind the app is the scripted double of ``gateway_doubles``, which cannot show a real
route (its docstring says what it cannot show). The same client against real workers, every answer
equal to the whole model: tests/integration/test_swarm_openai.py.
"""

from __future__ import annotations

import openai
import pytest
from gateway_doubles import MODEL, Script, ScriptedGenerator, live_server, make_app

from meshnet.core.errors import NoRoute, Unavailable

pytestmark = pytest.mark.timeout(30)

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def client_for(base_url: str) -> openai.AsyncOpenAI:
    # No retries: a 503 must surface at once, not be retried behind the test's back.
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


async def test_chat_non_streaming_returns_openai_object_with_usage() -> None:
    generator = ScriptedGenerator()
    async with live_server(make_app(generator)) as base:
        reply = await client_for(base).chat.completions.create(model=MODEL, messages=MESSAGES)
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.content == "Hello world"
    assert reply.choices[0].finish_reason == "stop"
    request, request_id = generator.requests[0]
    assert reply.id == request_id
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(request.prompt_tokens)
    assert reply.usage.completion_tokens == len("Hello world") + 1  # + EOS, as the route counted
    assert generator.endings[request_id] == "finished"


async def test_chat_streaming_ignores_telemetry_and_yields_text() -> None:
    generator = ScriptedGenerator()
    async with live_server(make_app(generator)) as base:
        stream = await client_for(base).chat.completions.create(
            model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
    # Every chunk the client produced is a real completion chunk: telemetry never leaked in.
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello world"
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    finishes = [reason for reason in finishes if reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12


async def test_text_completion_both_shapes() -> None:
    generator = ScriptedGenerator(Script(text="abc def"))
    async with live_server(make_app(generator)) as base:
        client = client_for(base)
        whole = await client.completions.create(model=MODEL, prompt="say")
        stream = await client.completions.create(model=MODEL, prompt="say", stream=True)
        pieces = [chunk async for chunk in stream]
    assert whole.object == "text_completion"
    assert whole.choices[0].text == "abc def"
    assert "".join(p.choices[0].text for p in pieces) == "abc def"
    assert pieces[-1].choices[0].finish_reason == "stop"
    prompt, _ = generator.requests[0]
    assert prompt.prompt_tokens[0] == 0  # completions add BOS; chat leaves it to the template


async def test_max_tokens_gives_length_and_reaches_the_route() -> None:
    generator = ScriptedGenerator()
    async with live_server(make_app(generator)) as base:
        reply = await client_for(base).chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=5,
            temperature=0.7,
            top_p=0.9,
            seed=42,
            extra_body={"top_k": 40},
        )
    assert reply.choices[0].message.content == "Hello"
    assert reply.choices[0].finish_reason == "length"
    request, _ = generator.requests[0]
    assert request.max_tokens == 5
    assert (request.sampling.temperature, request.sampling.top_p) == (0.7, 0.9)
    assert (request.sampling.top_k, request.sampling.seed) == (40, 42)
    assert request.stop_tokens == frozenset({1})


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_sequence_is_removed_and_closes_the_route(stream: bool) -> None:
    generator = ScriptedGenerator(Script(text="Hello world, and more"))
    async with live_server(make_app(generator)) as base:
        client = client_for(base)
        if stream:
            chunks = await client.chat.completions.create(
                model=MODEL, messages=MESSAGES, stop=["o w", "zzz"], stream=True
            )
            parts = [c async for c in chunks]
            text = "".join(c.choices[0].delta.content or "" for c in parts)
            finish = parts[-1].choices[0].finish_reason
        else:
            reply = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stop="o w")
            text, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
    assert (text, finish) == ("Hell", "stop")
    _, request_id = generator.requests[0]
    # The route cannot see stop strings, so the gateway cancels it by closing the iterator.
    assert generator.endings[request_id] == "aclose"
    assert generator.tokens_sent[request_id] == len("Hello w")


async def test_models_lists_cards_with_a_codec() -> None:
    async with live_server(make_app(ScriptedGenerator())) as base:
        page = await client_for(base).models.list()
    assert [model.id for model in page.data] == [MODEL]


async def test_client_raises_typed_errors() -> None:
    generator = ScriptedGenerator()
    async with live_server(make_app(generator)) as base:
        client = client_for(base)
        with pytest.raises(openai.NotFoundError) as not_found:
            await client.chat.completions.create(model="nope", messages=MESSAGES)
        assert not_found.value.code == "model_not_found"
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, top_logprobs=2)
        assert bad.value.code == "invalid_parameter"
        generator.script = Script(fail_before=NoRoute("no shard serves layers 12:24"))
        with pytest.raises(openai.InternalServerError) as unavailable:
            await client.chat.completions.create(model=MODEL, messages=MESSAGES)
        assert unavailable.value.status_code == 503
        assert "12:24" in unavailable.value.message


async def test_error_after_first_token_raises_in_the_stream() -> None:
    failure = Unavailable("node-b lost and no spare")
    generator = ScriptedGenerator(Script(fail_after_tokens=3, failure=failure))
    async with live_server(make_app(generator)) as base:
        stream = await client_for(base).chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        seen: list[str] = []
        with pytest.raises(openai.APIError) as raised:
            async for chunk in stream:
                seen.append(chunk.choices[0].delta.content or "")
    assert "".join(seen) == "Hel"
    assert raised.value.body == {
        "code": "worker_lost",
        "message": "node-b lost and no spare",
        "retryable": True,
        "request_id": generator.requests[0][1],
    }
