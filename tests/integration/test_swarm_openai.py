"""The official ``openai`` client and raw SSE against a live swarm: tracker, 3 llama.cpp workers, gateway.

Every answer is compared with the whole model run in process (greedy, same prompt tokens, same
tokenizer): the split across three processes and the HTTP layer must not change one token.
The telemetry tests read the raw stream, the polling endpoint and the replay stream of one request.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from swarm_harness import (
    MODEL_NAME,
    PROMPT,
    Reference,
    Swarm,
    chat_body,
    read_sse,
)

pytestmark = pytest.mark.timeout(90)

MAX_TOKENS = 48
TEXT_PROMPT = "the house and a dog"


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory, model: Path) -> Iterator[Swarm]:
    with Swarm(tmp_path_factory.mktemp("swarm"), model) as running:
        running.start_tracker()
        running.start_workers("0:2", "2:4", "4:6")
        running.start_gateway()
        running.wait_routable(nodes=3)
        yield running


@pytest.fixture(scope="module")
def base_url(swarm: Swarm) -> str:
    return swarm.gateways[0].ready_line.split()[3]


@pytest.fixture(scope="module")
def client(base_url: str, swarm: Swarm) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key=swarm.api_key, max_retries=0, timeout=30.0) as api:
        yield api


@pytest.fixture(scope="module")
def chat_reference(reference: Reference) -> str:
    text = reference.text(reference.generate(reference.chat_tokens(PROMPT), MAX_TOKENS))
    assert len(set(text)) > 5, f"the reference answer is too uniform to tell routes apart: {text!r}"
    return text


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    cards = list(client.models.list())
    assert [card.id for card in cards] == [MODEL_NAME]
    # The adapter (family and version) the shards slice with is part of the recipe users see.
    assert cards[0].model_extra is not None and cards[0].model_extra["adapter"] == "llama:2"


def test_streamed_chat_equals_whole_model_reference(client: openai.OpenAI, chat_reference: str) -> None:
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces: list[str] = []
    finish: list[str] = []
    usage: list[Any] = []
    for chunk in stream:
        if chunk.usage is not None:
            usage.append(chunk.usage)
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            if choice.finish_reason is not None:
                finish.append(choice.finish_reason)
    assert "".join(pieces) == chat_reference
    assert finish == ["length"]
    assert len(usage) == 1 and usage[0].completion_tokens == MAX_TOKENS


def test_chat_equals_whole_model_reference(client: openai.OpenAI, reference: Reference, chat_reference: str) -> None:
    reply = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert reply.choices[0].message.content == chat_reference
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(reference.chat_tokens(PROMPT))
    assert reply.usage.completion_tokens == MAX_TOKENS


def test_completions_equal_whole_model_reference(client: openai.OpenAI, reference: Reference) -> None:
    expected = reference.text(reference.generate(reference.text_tokens(TEXT_PROMPT), MAX_TOKENS))
    streamed = client.completions.create(
        model=MODEL_NAME,
        prompt=TEXT_PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
    )
    assert "".join(choice.text for chunk in streamed for choice in chunk.choices) == expected
    whole = client.completions.create(model=MODEL_NAME, prompt=TEXT_PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    assert whole.choices[0].text == expected
    assert whole.usage is not None and whole.usage.prompt_tokens == len(reference.text_tokens(TEXT_PROMPT))


# -- telemetry -----------------------------------------------------------------------------------

MILESTONES = ["accepted", "prefill_started", "prefill_completed", "decode_started"]


def _follow_events(base_url: str, request_id: str, auth: dict[str, str]) -> list[dict[str, Any]]:
    """Read /v1/telemetry/{id}/events to its end: ``event: telemetry`` frames with id and data."""
    events: list[dict[str, Any]] = []
    with httpx.stream("GET", f"{base_url}/v1/telemetry/{request_id}/events", headers=auth, timeout=30) as response:
        assert response.status_code == 200
        frame: dict[str, str] = {}
        for line in response.iter_lines():
            if line:
                field, _, value = line.partition(": ")
                frame[field] = value
                continue
            if frame:
                assert frame.get("event") == "telemetry"
                event = json.loads(frame["data"])
                assert int(frame["id"]) == event["seq"]
                events.append(event)
                frame = {}
    return events


def test_telemetry_of_a_live_request(swarm: Swarm, base_url: str) -> None:
    followed: list[list[dict[str, Any]]] = []
    followers: list[threading.Thread] = []

    def follow_once_started(item: Any, items: list[Any]) -> None:
        # Follow the events stream live, from the moment the first telemetry arrived.
        if not followers and item.kind == "telemetry":
            request_id = item.payload["request_id"]
            thread = threading.Thread(target=lambda: followed.append(_follow_events(base_url, request_id, swarm.auth)))
            followers.append(thread)
            thread.start()

    result = read_sse(base_url, "/v1/chat/completions", chat_body(96), on_item=follow_once_started, headers=swarm.auth)
    assert result.status == 200
    assert [item.kind for item in result.items][-1] == "done"
    everything = result.telemetry()
    assert [event["seq"] for event in everything] == list(range(len(everything)))
    # One prefill_progress per prefill chunk, between prefill_started and prefill_completed.
    chunks = [i for i, event in enumerate(everything) if event["kind"] == "prefill_progress"]
    assert chunks and chunks == list(range(2, 2 + len(chunks))), everything
    inline = [event for event in everything if event["kind"] != "prefill_progress"]
    kinds = [event["kind"] for event in inline]
    assert kinds[:4] == MILESTONES, kinds
    assert kinds[-1] == "completed", kinds
    assert set(kinds[4:-1]) == {"progress"}, kinds
    assert all(event["request_id"] == result.request_id for event in inline)
    assert [event["at"] for event in inline] == sorted(event["at"] for event in inline)

    accepted = inline[0]
    assert [(hop["address"], hop["layers"]) for hop in accepted["hops"]] == [
        (w.address, str(w.layers)) for w in swarm.live_workers()
    ]
    assert inline[2]["prompt_tokens"] == inline[1]["prompt_tokens"] > 0
    progress = [event["generated_tokens"] for event in inline if event["kind"] == "progress"]
    assert len(progress) >= 96 // 8 - 1 and progress == sorted(set(progress)), progress
    assert 0 < progress[-1] <= 96
    assert inline[-1]["finish_reason"] == "length"
    assert inline[-1]["usage"]["completion_tokens"] == 96
    # decode_started goes out before the first token's text.
    first_chunk = next(i for i, item in enumerate(result.items) if item.kind == "chunk" and item.text)
    assert (
        result.items.index(
            next(i for i in result.items if i.kind == "telemetry" and i.payload["kind"] == "decode_started")
        )
        < first_chunk
    )

    snapshot = httpx.get(f"{base_url}/v1/telemetry/{result.request_id}", headers=swarm.auth, timeout=5).json()
    assert snapshot["state"] == "completed" and snapshot["finished"] is True
    assert snapshot["generated_tokens"] == 96 and snapshot["finish_reason"] == "length"
    assert snapshot["route"]["hops"] == accepted["hops"]
    assert snapshot["last_seq"] == inline[-1]["seq"]
    assert snapshot["error"] is None

    for thread in followers:
        thread.join(timeout=30)
    assert followed == [everything], "the live events stream must carry exactly the inline telemetry"
    replayed = _follow_events(base_url, result.request_id, swarm.auth)
    assert replayed == everything, "replay after the end must be the same"


def test_telemetry_of_an_unknown_request_is_404(base_url: str, swarm: Swarm) -> None:
    for path in ("/v1/telemetry/req-unknown", "/v1/telemetry/req-unknown/events"):
        response = httpx.get(base_url + path, headers=swarm.auth, timeout=5)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "telemetry_not_found"
