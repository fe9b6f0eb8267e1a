"""SmolLM2-135M-Instruct (Q4_1) through ``/v1/responses`` on a 3-worker swarm: the streamed greedy
answer equals the whole model run in process on the same chat prompt (instructions as the
system turn), and a ``text.format`` json_schema answer parses and matches its schema.

Needs MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 and the provisioned model.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from smollm2_model import MARKS, MODEL
from swarm_harness import Reference, Swarm

from meshnet.artifact.provision import DEFAULT_MODEL

pytestmark = [*MARKS, pytest.mark.timeout(300)]

INSTRUCTIONS = "You are a terse geography assistant."
QUESTION = "What is the capital of France? Answer in one sentence."
MAX_TOKENS = 32
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    with Swarm(tmp_path_factory.mktemp("swarm"), MODEL, model_name=DEFAULT_MODEL.name) as swarm:
        swarm.start_tracker()
        swarm.start_workers("0:10", "10:20", "20:30")
        base_url = swarm.start_gateway()
        swarm.wait_routable(nodes=3, timeout_s=60)
        with openai.OpenAI(base_url=f"{base_url}/v1", api_key=swarm.api_key, max_retries=0, timeout=120.0) as api:
            yield api


def test_streamed_response_equals_the_whole_model(client: openai.OpenAI, tmp_path: Path) -> None:
    reference = Reference(MODEL, tmp_path / "cache")
    try:
        turns = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}]
        prompt = tuple(reference.tokenizer.encode_chat(turns))
        expected = reference.text(reference.generate(prompt, MAX_TOKENS))
    finally:
        reference.close()
    with client.responses.stream(
        model=DEFAULT_MODEL.name, instructions=INSTRUCTIONS, input=QUESTION, temperature=0, max_output_tokens=MAX_TOKENS
    ) as stream:
        ended: Any = list(stream)[-1]  # response.completed, or response.incomplete when cut
    final = ended.response
    assert final.output_text == expected
    assert final.usage is not None and final.usage.input_tokens == len(prompt)


def test_json_schema_format_parses_on_the_real_model(client: openai.OpenAI) -> None:
    reply = client.responses.create(
        model=DEFAULT_MODEL.name,
        input=QUESTION,
        temperature=0,
        max_output_tokens=48,
        text={"format": {"type": "json_schema", "name": "capital", "schema": SCHEMA}},
    )
    assert reply.status == "completed"
    jsonschema.validate(json.loads(reply.output_text), SCHEMA)
