"""``n`` > 1 at the gateway: one route session per choice with its own seed, merged answers,
and a failing choice ending the others (no route left running), streamed or not.

The route behind the app is the scripted double of ``gateway_doubles``, which cannot show a real
route (its docstring says what it cannot show). Choices of real sampled tokens, each equal to its
own whole-model run: tests/integration/test_swarm_openai_params.py.
"""

from __future__ import annotations

import asyncio

import openai
import pytest
from gateway_doubles import MODEL, Script, ScriptedGenerator, live_server, make_app

from meshnet.core.errors import Unavailable
from meshnet.core.tracking import billing_units

pytestmark = pytest.mark.timeout(30)

MESSAGES = [{"role": "user", "content": "hi"}]


def client_for(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


async def test_each_choice_is_a_session_with_its_own_seed() -> None:
    generator = ScriptedGenerator()
    async with live_server(make_app(generator)) as base:
        reply = await client_for(base).chat.completions.create(
            model=MODEL, messages=MESSAGES, n=3, temperature=0.7, seed=41
        )
    assert [choice.index for choice in reply.choices] == [0, 1, 2]
    assert all(choice.message.content == "Hello world" for choice in reply.choices)
    seeds = [request.sampling.seed for request, _ in generator.requests]
    assert seeds == [41, 42, 43]
    ids = [request_id for _, request_id in generator.requests]
    assert ids == [reply.id, f"{reply.id}-1", f"{reply.id}-2"]
    assert reply.usage is not None
    completion = len("Hello world") + 1
    assert reply.usage.completion_tokens == 3 * completion
    prompt = len(generator.requests[0][0].prompt_tokens)
    assert reply.usage.prompt_tokens == prompt  # counted once: every choice has the same prompt
    # The prompt is billed once, as usage counts it: billing follows the usage the client sees.
    billed = reply.usage.billing_units  # type: ignore[attr-defined]
    assert billed == billing_units(reply.usage.prompt_tokens, reply.usage.completion_tokens)
    assert set(generator.endings.values()) == {"finished"}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_failing_choice_ends_every_choice(stream: bool) -> None:
    generator = ScriptedGenerator(Script(fail_after_tokens=3, failure=Unavailable("node-b lost"), token_delay=0.01))
    async with live_server(make_app(generator)) as base:
        client = client_for(base)
        if stream:
            chunks = await client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, stream=True)
            with pytest.raises(openai.APIError):
                async for _ in chunks:
                    pass
        else:
            with pytest.raises(openai.APIStatusError):
                await client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2)
        for _ in range(100):  # the stream's close runs just after its last byte
            if len(generator.endings) == 2:
                break
            await asyncio.sleep(0.02)
    assert len(generator.endings) == 2
    assert "finished" not in generator.endings.values()
