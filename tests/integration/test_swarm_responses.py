"""``client.responses.create`` (whole and streamed) and ``client.responses.stream`` with the
official openai client against a live swarm: tracker, three llama.cpp workers, gateway.

Greedy answers are compared with the whole model run in process on the same prompt tokens (the
chat template of the instructions and input items): the Responses endpoint must ask the route for
exactly what chat would, and the split must not change one token. A ``text.format`` json_schema
answer must equal the chat endpoint's ``response_format`` answer, both under the same grammar.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai_swarm import openai_swarm
from swarm_harness import MODEL_NAME, PROMPT, Reference

pytestmark = pytest.mark.timeout(120)

MAX_TOKENS = 24
SCHEMA = {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, model: Path) -> Iterator[openai.OpenAI]:
    with openai_swarm(tmp_path_factory.mktemp("swarm"), model, "0:2", "2:4", "4:6") as (_, api):
        yield api


def _expected(reference: Reference, messages: list[dict[str, str]]) -> tuple[str, int]:
    prompt = tuple(reference.tokenizer.encode_chat(messages))
    return reference.text(reference.generate(prompt, MAX_TOKENS)), len(prompt)


def test_whole_response_equals_the_whole_model(client: openai.OpenAI, reference: Reference) -> None:
    reply = client.responses.create(
        model=MODEL_NAME, input=PROMPT, instructions="answer", temperature=0, max_output_tokens=MAX_TOKENS
    )
    text, prompt_tokens = _expected(
        reference, [{"role": "system", "content": "answer"}, {"role": "user", "content": PROMPT}]
    )
    assert reply.output_text == text
    assert reply.usage is not None and reply.usage.input_tokens == prompt_tokens
    assert reply.status in ("completed", "incomplete")


def test_streamed_response_equals_the_whole_model(client: openai.OpenAI, reference: Reference) -> None:
    items: list[Any] = [
        {"role": "user", "content": [{"type": "input_text", "text": "hello"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "the dog"}]},
        {"role": "user", "content": PROMPT},
    ]
    stream = client.responses.create(
        model=MODEL_NAME, input=items, temperature=0, max_output_tokens=MAX_TOKENS, stream=True
    )
    events = list(stream)
    text, _ = _expected(
        reference,
        [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "the dog"},
            {"role": "user", "content": PROMPT},
        ],
    )
    deltas = "".join(getattr(event, "delta", "") for event in events if event.type == "response.output_text.delta")
    final: Any = events[-1]
    assert final.type == f"response.{final.response.status}"  # response.incomplete when cut, as OpenAI
    assert deltas == final.response.output_text == text
    assert [event.sequence_number for event in events] == list(range(len(events)))
    with client.responses.stream(model=MODEL_NAME, input=items, temperature=0, max_output_tokens=MAX_TOKENS) as helper:
        ended: Any = list(helper)[-1]  # get_final_response() needs response.completed (openai-python#3538)
    assert ended.type == final.type and ended.response.output_text == text


def test_json_schema_format_equals_the_chat_response_format(client: openai.OpenAI) -> None:
    reply = client.responses.create(
        model=MODEL_NAME,
        input=PROMPT,
        temperature=0,
        max_output_tokens=MAX_TOKENS,
        text={"format": {"type": "json_schema", "name": "count", "schema": SCHEMA}},
    )
    chat = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": PROMPT}],
        temperature=0,
        max_tokens=MAX_TOKENS,
        response_format={"type": "json_schema", "json_schema": {"name": "count", "schema": SCHEMA}},
    )
    assert reply.output_text == chat.choices[0].message.content
    assert reply.output_text.startswith("{")


def test_stored_responses_are_refused_with_a_reason(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="keeps no responses"):
        client.responses.create(model=MODEL_NAME, input=PROMPT, store=True)
