"""SmolLM2-135M-Instruct (Q4_1) served end to end: ``meshnet up`` and a 3-worker swarm behind the gateway.

``meshnet up --demo-only`` must start tracker, workers and gateway, stream its demo and exit 0;
the demo's answer must be the whole model's greedy answer, token for token.
Then the official ``openai`` client streams a greedy chat answer through tracker + 3 workers
(layers 0:10, 10:20, 20:30) + gateway, and its text must equal the whole model run in process.

Needs MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 and the provisioned model under
$MESHNET_DATA_DIR/models (default .data/models).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

# The swarm harness lives with the integration tests; this directory is not a package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from smollm2_model import ENABLED_MARK, MODEL, PROVISIONED_MARK
from swarm_harness import Reference, Swarm, chat_body, meshnet_command, read_sse

from meshnet.artifact.provision import DEFAULT_MODEL
from meshnet.deploy.config import LocalSwarmConfig
from meshnet.node.config import WorkerConfig

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.timeout(180),
    ENABLED_MARK,
    PROVISIONED_MARK,
]

CHAT = "What is the capital of France? Answer in one sentence."
MAX_TOKENS = 32
UP_TIMEOUT_S = 120
DEMO_PROMPT = next(str(f.default) for f in fields(LocalSwarmConfig) if f.name == "prompt")
"""What ``meshnet up`` asks when no --prompt is given."""
DEMO_TOKENS = 24


def test_meshnet_up_demo_only_streams_the_whole_models_answer_and_exits_0(tmp_path: Path) -> None:
    reference = Reference(MODEL, tmp_path / "reference-cache")
    try:
        tokens = reference.generate(reference.chat_tokens(DEMO_PROMPT), DEMO_TOKENS)
        expected = reference.text(tokens)
    finally:
        reference.close()
    # A data dir of its own (logs, slice cache), with the provisioned model linked in, so `up`
    # finds the default model exactly as a user's would.
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / MODEL.name).symlink_to(MODEL.resolve())
    done = subprocess.run(
        meshnet_command(tmp_path, "up", "--demo-only", "--port", "0", "--max-tokens", str(DEMO_TOKENS)),
        capture_output=True,
        text=True,
        timeout=UP_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-3000:]}"
    out = done.stdout
    assert out.count("\nworker    ") + out.startswith("worker    ") == 3, out
    assert "tracker   127.0.0.1:" in out and "gateway   http://127.0.0.1:" in out, out
    assert f"model {MODEL.stem!r}" in out, out  # served under the file's stem, as a worker given the file is
    assert f"> {DEMO_PROMPT}" in out, out
    demo = out.split(f"> {DEMO_PROMPT}", 1)[1]
    assert "[accepted: " in demo and "[completed: " in demo, out
    # The streamed text sits between the decode_started line and the completed line.
    answer = demo.split("[decode_started", 1)[1].split("\n", 1)[1].split("\n  [completed: ", 1)[0]
    assert answer == expected, f"the demo's answer is not the whole model's:\n{answer!r}\n{expected!r}"
    completion = re.search(r'"completion_tokens":(\d+)', demo)
    assert completion is not None and int(completion.group(1)) == len(tokens), out  # EOS included


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    with Swarm(tmp_path_factory.mktemp("swarm"), MODEL, model_name=DEFAULT_MODEL.name) as running:
        running.start_tracker()
        running.start_workers("0:10", "10:20", "20:30")
        running.start_gateway()
        running.wait_routable(nodes=3, timeout_s=60)
        yield running


def test_openai_stream_through_three_workers_equals_whole_model(swarm: Swarm, tmp_path: Path) -> None:
    import openai

    reference = Reference(MODEL, tmp_path / "cache")
    try:
        tokens = reference.generate(reference.chat_tokens(CHAT), MAX_TOKENS)
        expected = reference.text(tokens)
    finally:
        reference.close()
    assert "Paris" in expected, expected

    base_url = swarm.gateways[0].ready_line.split()[3]
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key=swarm.api_key, max_retries=0, timeout=60) as client:
        stream = client.chat.completions.create(
            model=DEFAULT_MODEL.name,
            messages=[{"role": "user", "content": CHAT}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
        )
        text = "".join(choice.delta.content or "" for chunk in stream for choice in chunk.choices)
    assert text == expected


PREFILLED = [
    {"role": "user", "content": "What is the capital of France? Answer in one sentence."},
    {"role": "assistant", "content": "The capital of France is"},
]


def test_a_trailing_assistant_message_is_continued_as_the_whole_model_continues_it(
    swarm: Swarm, tmp_path: Path
) -> None:
    """Assistant prefill through three workers: the prompt ends inside SmolLM2's assistant turn
    and the reply is only the continuation, equal to the whole model's greedy continuation."""
    import openai

    reference = Reference(MODEL, tmp_path / "cache")
    try:
        prompt = reference.tokenizer.encode_chat_continuation(PREFILLED)
        expected = reference.text(reference.generate(prompt, MAX_TOKENS))
    finally:
        reference.close()
    assert "Paris" in expected and not expected.lstrip().startswith("The capital"), expected

    base_url = swarm.gateways[0].ready_line.split()[3]
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key=swarm.api_key, max_retries=0, timeout=60) as client:
        reply = client.chat.completions.create(
            model=DEFAULT_MODEL.name,
            messages=PREFILLED,
            max_tokens=MAX_TOKENS,
            temperature=0,  # type: ignore[arg-type]
        )
    assert reply.choices[0].message.content == expected
    assert reply.usage is not None and reply.usage.prompt_tokens == len(prompt)


# -- JSON mode: the tail (layers 20:30, a slice that keeps the vocabulary) samples under
# llama.cpp's grammar, and the answer must parse.

JSON_MAX_TOKENS = 160
COUNTRY_SCHEMA = {
    "type": "object",
    "properties": {"country": {"type": "string"}, "capital": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["country", "capital", "population"],
    "additionalProperties": False,
}


def _ask_json(swarm: Swarm, content: str, response_format: Any, **extra: Any) -> Any:
    import openai

    base_url = swarm.gateways[0].ready_line.split()[3]
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key=swarm.api_key, max_retries=0, timeout=120) as client:
        return client.chat.completions.create(
            model=DEFAULT_MODEL.name,
            messages=[{"role": "user", "content": content}],
            max_tokens=JSON_MAX_TOKENS,
            temperature=0,
            response_format=response_format,
            **extra,
        )


def test_json_object_answer_parses(swarm: Swarm) -> None:
    reply = _ask_json(swarm, "Describe France as a JSON object with its capital and language.", {"type": "json_object"})
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(json.loads(choice.message.content or ""), dict), choice.message.content


def test_json_schema_answer_matches_the_schema_with_logprobs(swarm: Swarm) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "country", "schema": COUNTRY_SCHEMA}}
    reply = _ask_json(swarm, "Give the country, capital and population of France.", response_format, logprobs=True)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    answer = json.loads(choice.message.content or "")
    assert set(answer) == {"country", "capital", "population"}, answer
    assert isinstance(answer["country"], str) and isinstance(answer["capital"], str), answer
    assert isinstance(answer["population"], int), answer
    # Logprobs ride along, the model's own (never above 0); the end-of-text token counts as
    # generated but is not text, so it has no entry.
    assert choice.logprobs is not None and choice.logprobs.content is not None and reply.usage is not None
    assert len(choice.logprobs.content) == reply.usage.completion_tokens - 1
    assert "".join(entry.token for entry in choice.logprobs.content) == choice.message.content
    assert all(entry.logprob <= 0.0 for entry in choice.logprobs.content)


LONG_CHAT = "Summarize in one line. " + "The quick brown fox jumps over the lazy dog near the river bank. " * 28
"""About 400 tokens: several engine chunks, so several prefill frames."""


def test_a_prompt_of_several_chunks_streams_progress_per_chunk_and_equals_whole_model(
    swarm: Swarm, tmp_path: Path
) -> None:
    reference = Reference(MODEL, tmp_path / "cache")
    try:
        prompt = reference.chat_tokens(LONG_CHAT)
        expected = reference.text(reference.generate(prompt, 16))
    finally:
        reference.close()
    assert 256 < len(prompt) <= 512 - 16, len(prompt)
    base_url = swarm.gateways[0].ready_line.split()[3]
    body = {**chat_body(16, content=LONG_CHAT), "model": DEFAULT_MODEL.name}
    result = read_sse(base_url, "/v1/chat/completions", body, headers=swarm.auth)
    assert result.status == 200
    progress = [(event["done_tokens"], event["total_tokens"]) for event in result.telemetry("prefill_progress")]
    chunk = WorkerConfig.prefill_chunk
    total = len(prompt)
    assert progress == [(min(done, total), total) for done in range(chunk, total + chunk, chunk)]
    assert result.text == expected  # one frame per chunk keeps the engine's cuts: bit-identical
