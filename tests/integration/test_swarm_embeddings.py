"""``client.embeddings.create`` with the official openai client against a live swarm: tracker,
three llama.cpp workers (a 3-way split), gateway.

The oracle is whole-model llama.cpp: llama-cpp-python's ``Llama(embedding=True,
pooling_type=LAST).embed`` on the same GGUF, micro-batched as the workers chunk a prompt. The
gateway's vectors must equal it bit for bit: as floats (float64, as ``embed`` returns them) and
as base64 (their float32 bytes, which the client decodes). Several inputs in one call, token-id
inputs, a prompt over several prefill chunks; bad input gets an OpenAI-shaped 400.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import numpy as np
import openai
import pytest
from embedding_oracle import embedding_oracle
from openai_swarm import openai_swarm
from swarm_harness import CONTEXT, LONG_PROMPT, MODEL_NAME, PROMPT, Swarm, query_db

from meshnet.node.config import WorkerConfig

pytestmark = pytest.mark.timeout(180)

SECOND = "the dog ran to the big tree"


@pytest.fixture(scope="module")
def oracle(model: Path) -> Iterator[llama_cpp.Llama]:
    llm = embedding_oracle(model)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, model: Path) -> Iterator[tuple[Swarm, openai.OpenAI]]:
    with openai_swarm(tmp_path_factory.mktemp("swarm"), model, "0:2", "2:4", "4:6") as running:
        yield running


@pytest.fixture(scope="module")
def swarm(served: tuple[Swarm, openai.OpenAI]) -> Swarm:
    return served[0]


@pytest.fixture(scope="module")
def client(served: tuple[Swarm, openai.OpenAI]) -> openai.OpenAI:
    return served[1]


def _expected(oracle: llama_cpp.Llama, text: str) -> np.ndarray:
    return np.array(oracle.embed(text, normalize=True), dtype=np.float64)  # unit length, as OpenAI's


def test_float_embeddings_of_a_split_equal_whole_model_llama_cpp(
    client: openai.OpenAI, oracle: llama_cpp.Llama
) -> None:
    texts = [PROMPT, SECOND, LONG_PROMPT]
    assert len(oracle.tokenize(LONG_PROMPT.encode())) > WorkerConfig.prefill_chunk  # several prefill chunks
    reply = client.embeddings.create(model=MODEL_NAME, input=texts, encoding_format="float")
    assert [item.index for item in reply.data] == [0, 1, 2]
    for item, text in zip(reply.data, texts, strict=True):
        got = np.array(item.embedding, dtype=np.float64)
        expected = _expected(oracle, text)
        assert np.array_equal(got, expected), f"max |diff| {np.abs(got - expected).max()}"
    tokens = sum(len(oracle.tokenize(text.encode())) for text in texts)
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == tokens


def test_base64_embeddings_are_the_float32_of_llama_cpp(client: openai.OpenAI, oracle: llama_cpp.Llama) -> None:
    reply = client.embeddings.create(model=MODEL_NAME, input=PROMPT)  # the client asks for base64
    got = np.array(reply.data[0].embedding, dtype=np.float32)
    assert np.array_equal(got, _expected(oracle, PROMPT).astype(np.float32))


def test_token_id_inputs_equal_their_text(client: openai.OpenAI, oracle: llama_cpp.Llama) -> None:
    ids = [oracle.tokenize(PROMPT.encode()), oracle.tokenize(SECOND.encode())]
    one = client.embeddings.create(model=MODEL_NAME, input=ids[0], encoding_format="float")
    both = client.embeddings.create(model=MODEL_NAME, input=ids, encoding_format="float")
    assert np.array_equal(np.array(one.data[0].embedding), _expected(oracle, PROMPT))
    assert np.array_equal(np.array(both.data[1].embedding), _expected(oracle, SECOND))
    assert both.usage.prompt_tokens == len(ids[0]) + len(ids[1])


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"input": []}, "empty"),
        ({"input": ""}, "empty"),
        ({"input": [[1, 2], []]}, "empty"),
        ({"input": [10**6]}, "outside this model's vocabulary"),
        ({"input": PROMPT, "dimensions": 3}, "not truncated"),
        ({"input": PROMPT, "encoding_format": "int8"}, "encoding_format"),
        ({"input": " ".join(["dog"] * 4 * CONTEXT)}, "at most"),
    ],
    ids=["no-inputs", "empty-string", "empty-ids", "bad-id", "dimensions", "format", "too-long"],
)
def test_bad_input_is_an_openai_400(client: openai.OpenAI, fields: dict[str, object], match: str) -> None:
    with pytest.raises(openai.BadRequestError, match=match):
        client.embeddings.create(model=MODEL_NAME, **fields)  # type: ignore[arg-type]


def test_an_unknown_model_is_a_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input=PROMPT)


def test_each_input_is_billed_under_its_own_work_record(
    swarm: Swarm, client: openai.OpenAI, oracle: llama_cpp.Llama
) -> None:
    raw = client.embeddings.with_raw_response.create(model=MODEL_NAME, input=[PROMPT, SECOND])
    request_id = raw.headers["x-request-id"]
    lengths = [len(oracle.tokenize(text.encode())) for text in (PROMPT, SECOND)]
    for key, tokens in zip((request_id, f"{request_id}-1"), lengths, strict=True):
        query = f"SELECT status, tokens_in, tokens_out FROM work_records WHERE request_id = '{key}'"
        deadline = time.monotonic() + 10.0
        while not query_db(swarm.db_path, query) or query_db(swarm.db_path, query)[0][0] == "unverified":
            assert time.monotonic() < deadline, f"no work record of {key} was settled"
            time.sleep(0.1)
        assert query_db(swarm.db_path, query)[0] == ("completed", tokens, 0)
