"""JSON mode on the real SmolLM2-135M-Instruct through a 3-worker swarm: the answer must parse.

``response_format`` json_object and json_schema are sampled under llama.cpp's grammar at the
tail (layers 20:30 here, a slice that keeps the vocabulary); the official ``openai`` client
reads the answers, and ``json.loads`` must accept each, with the schema's keys and types.

Needs MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 and the provisioned model under
$MESHNET_DATA_DIR/models (default .data/models).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

# The swarm harness lives with the integration tests; this directory is not a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from swarm_harness import Swarm

from meshnet.artifact.provision import DEFAULT_MODEL, model_path

DATA_DIR = Path(os.environ.get("MESHNET_DATA_DIR", Path(__file__).resolve().parents[2] / ".data"))
MODEL = model_path(DATA_DIR / "models")
ENABLED = os.environ.get("MESHNET_ENABLE_REAL_INFERENCE_TESTS") == "1"

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.timeout(240),
    pytest.mark.skipif(not ENABLED, reason="set MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 to run real-model tests"),
    pytest.mark.skipif(ENABLED and not MODEL.exists(), reason=f"{MODEL} is not provisioned (meshnet provision)"),
]

MAX_TOKENS = 160
SCHEMA = {
    "type": "object",
    "properties": {"country": {"type": "string"}, "capital": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["country", "capital", "population"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    with Swarm(tmp_path_factory.mktemp("swarm"), MODEL, model_name=DEFAULT_MODEL.name) as swarm:
        swarm.start_tracker()
        swarm.start_workers("0:10", "10:20", "20:30")
        base_url = swarm.start_gateway()
        swarm.wait_routable(nodes=3, timeout_s=60)
        with openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120.0) as api:
            yield api


def _ask(client: openai.OpenAI, content: str, response_format: Any, **extra: Any) -> Any:
    return client.chat.completions.create(
        model=DEFAULT_MODEL.name,
        messages=[{"role": "user", "content": content}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        response_format=response_format,
        **extra,
    )


def test_json_object_answer_parses(client: openai.OpenAI) -> None:
    reply = _ask(client, "Describe France as a JSON object with its capital and language.", {"type": "json_object"})
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(json.loads(choice.message.content or ""), dict), choice.message.content


def test_json_schema_answer_matches_the_schema(client: openai.OpenAI) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "country", "schema": SCHEMA, "strict": True}}
    reply = _ask(client, "Give the country, capital and population of France.", response_format, logprobs=True)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    answer = json.loads(choice.message.content or "")
    assert set(answer) == {"country", "capital", "population"}, answer
    assert isinstance(answer["country"], str) and isinstance(answer["capital"], str), answer
    assert isinstance(answer["population"], int), answer
    # Logprobs ride along: one per generated token, the model's own (never above 0).
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert reply.usage is not None
    # The end-of-text token counts as generated but is not text, so it has no entry.
    assert len(choice.logprobs.content) == reply.usage.completion_tokens - 1
    assert "".join(entry.token for entry in choice.logprobs.content) == choice.message.content
    assert all(entry.logprob <= 0.0 for entry in choice.logprobs.content)
