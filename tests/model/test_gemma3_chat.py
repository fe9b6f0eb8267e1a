"""Gemma 3 270M is a base model with no chat template: through the real gateway app and its
real tokenizer, chat is a clear 400 (``chat_template_missing``) while completions are served,
and a template given with --chat-template makes chat work.

Only the tokenizer and the chat template are Gemma 3's here: the route behind the gateway is the
scripted double of ``gateway_doubles``, so answers are not the model's. Gemma 3 answering through
real workers, equal to the whole model: test_distributed_gemma3.py.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "gateway"))

from gateway_doubles import MODEL, ScriptedGenerator, make_app
from gemma3_model import MARKS
from gemma3_model import MODEL as GEMMA

pytestmark = MARKS

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def _client(chat_template: str | None) -> Iterator[TestClient]:
    from meshnet.artifact.describe import describe_model
    from meshnet.engine.tokenizer import Tokenizer

    tokenizer = Tokenizer(describe_model(GEMMA), chat_template=chat_template)
    with TestClient(make_app(ScriptedGenerator(), tokenizer), raise_server_exceptions=False) as client:
        yield client
    tokenizer.close()


@pytest.fixture
def plain() -> Iterator[TestClient]:
    yield from _client(None)


@pytest.fixture
def templated() -> Iterator[TestClient]:
    yield from _client(TEMPLATE)


def test_chat_is_a_clear_400_and_completions_work(plain: TestClient) -> None:
    chat = plain.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400
    assert chat.json()["error"]["code"] == "chat_template_missing"
    assert "--chat-template" in chat.json()["error"]["message"]
    text = plain.post("/v1/completions", json={"model": MODEL, "prompt": "The sea is", "max_tokens": 4})
    assert text.status_code == 200, text.text


def test_a_given_template_serves_chat(templated: TestClient) -> None:
    chat = templated.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    )
    assert chat.status_code == 200, chat.text
