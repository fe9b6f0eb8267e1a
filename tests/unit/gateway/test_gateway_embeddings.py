"""``POST /v1/embeddings`` in the real gateway app over a scripted embedder: the inputs' token
ids, their order, both encodings, usage, and an OpenAI-shaped 4xx for every bad body.

The embedder double returns a vector made from the token ids it is given, so these tests show
what the gateway asks of the route and how it shapes the answer; that the vectors equal
whole-model llama.cpp is shown over real workers (tests/integration/test_swarm_embeddings.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from gateway_doubles import HOP_CAPABILITY, MODEL, ByteCodec, ScriptedGenerator, make_app

from meshnet.core.embedding import Embedded, EmbeddingSpec
from meshnet.core.events import RouteAccepted, RouteHop
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.gateway.embeddings.body import EmbeddingsBody, encoded, input_tokens
from meshnet.gateway.request_ledger import logger as ledger_logger

PATH = "/v1/embeddings"
LEDGER_LOGGER = ledger_logger.name
BOS, OFFSET = 0, 2


class ScriptedEmbedder(ScriptedGenerator):
    """Embeds ``tokens`` as (len, sum, first / 3): distinct per input, not exactly a float32."""

    def __init__(self) -> None:
        super().__init__()
        self.embedded: list[tuple[int, ...]] = []
        self.failure: BaseException | None = None

    async def embed(self, request: GenerationRequest, spec: EmbeddingSpec, request_id: RequestId) -> Embedded:
        self.embedded.append(request.prompt_tokens)
        if self.failure is not None:
            raise self.failure
        tokens = request.prompt_tokens
        hop = RouteHop(NodeId(f"node-{len(tokens)}"), "127.0.0.1:5001", LayerRange(0, 24), HOP_CAPABILITY)
        route = RouteAccepted(request_id, SessionId("s-embed"), MODEL, "Q8_0", (hop,), epoch=3)
        return Embedded((float(len(tokens)), float(sum(tokens)), tokens[-1] / 3), route)


def _ids(text: str) -> tuple[int, ...]:
    return (BOS, *(byte + OFFSET for byte in text.encode()))


def _vector(tokens: tuple[int, ...]) -> list[float]:
    return [float(len(tokens)), float(sum(tokens)), tokens[-1] / 3]


def test_each_input_is_embedded_in_order_with_its_usage() -> None:
    embedder = ScriptedEmbedder()
    with TestClient(make_app(embedder)) as client:
        reply = client.post(PATH, json={"model": MODEL, "input": ["ab", "c"], "encoding_format": "float"})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert embedder.embedded == [_ids("ab"), _ids("c")]
    assert [item["embedding"] for item in body["data"]] == [_vector(_ids("ab")), _vector(_ids("c"))]
    assert [item["index"] for item in body["data"]] == [0, 1]
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    assert body["object"] == "list" and body["model"] == MODEL


def test_base64_is_little_endian_float32() -> None:
    with TestClient(make_app(ScriptedEmbedder())) as client:
        reply = client.post(PATH, json={"model": MODEL, "input": [[5, 6, 7]], "encoding_format": "base64"})
    raw = base64.b64decode(reply.json()["data"][0]["embedding"])
    assert np.array_equal(np.frombuffer(raw, dtype="<f4"), np.array(_vector((5, 6, 7)), dtype=np.float32))


def test_one_list_of_ids_is_one_input() -> None:
    body = EmbeddingsBody(model=MODEL, input=[5, 6])
    assert input_tokens(body, ByteCodec(), 64) == ((5, 6),)
    assert input_tokens(EmbeddingsBody(model=MODEL, input=[[5], [6, 7]]), ByteCodec(), 64) == ((5,), (6, 7))


def test_float_encoding_keeps_every_float64_bit() -> None:
    value = 1 / 3
    assert encoded((value,), "float") == [value]
    assert np.frombuffer(base64.b64decode(str(encoded((value,), "base64"))), "<f4")[0] == np.float32(value)


BAD: dict[str, tuple[dict[str, Any], int, str]] = {
    "no input": ({"model": MODEL}, 400, "missing_required_parameter"),
    "empty list": ({"model": MODEL, "input": []}, 400, "empty_input"),
    "empty string": ({"model": MODEL, "input": ""}, 400, "empty_input"),
    "an empty id list": ({"model": MODEL, "input": [[5], []]}, 400, "empty_input"),
    "mixed list": ({"model": MODEL, "input": ["a", 5]}, 400, "invalid_parameter"),
    "id outside the vocabulary": ({"model": MODEL, "input": [5, 9999]}, 400, "invalid_parameter"),
    "negative id": ({"model": MODEL, "input": [-1]}, 400, "invalid_parameter"),
    "over the context": ({"model": MODEL, "input": "y" * 300}, 400, "context_length_exceeded"),
    "dimensions": ({"model": MODEL, "input": "a", "dimensions": 2}, 400, "unsupported_parameter"),
    "encoding": ({"model": MODEL, "input": "a", "encoding_format": "int8"}, 400, "invalid_parameter"),
    "unknown model": ({"model": "nope", "input": "a"}, 404, "model_not_found"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_bodies_get_openai_errors(case: str) -> None:
    body, status, code = BAD[case]
    embedder = ScriptedEmbedder()
    with TestClient(make_app(embedder)) as client:
        reply = client.post(PATH, json=body)
    assert reply.status_code == status, reply.text
    assert reply.json()["error"]["code"] == code
    assert set(reply.json()["error"]) == {"message", "type", "code", "param"}


def test_a_swarm_that_cannot_embed_answers_501_with_why() -> None:
    with TestClient(make_app(ScriptedGenerator())) as client:
        reply = client.post(PATH, json={"model": MODEL, "input": "a"})
    assert reply.status_code == 501
    assert reply.json()["error"]["code"] == "embeddings_unsupported"
    assert "cannot serve embeddings" in reply.json()["error"]["message"]


def test_the_request_telemetry_ends_completed_with_its_usage_and_route(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=LEDGER_LOGGER), TestClient(make_app(ScriptedEmbedder())) as client:
        reply = client.post(PATH, json={"model": MODEL, "input": ["ab", "c"]})
        snapshot = client.get(f"/v1/telemetry/{reply.headers['x-request-id']}").json()
    assert snapshot["state"] == "completed" and snapshot["usage"]["prompt_tokens"] == 5
    assert [hop["node_id"] for hop in snapshot["route"]["hops"]] == ["node-2"]  # the last input's route
    lines = [record.getMessage() for record in caplog.records if reply.headers["x-request-id"] in record.getMessage()]
    assert len(lines) == 1 and "route=node-2 " in lines[0] and "outcome=completed" in lines[0]


def test_dimensions_are_refused_before_any_input_is_embedded() -> None:
    embedder = ScriptedEmbedder()
    with TestClient(make_app(embedder)) as client:
        refused = client.post(PATH, json={"model": MODEL, "input": "a", "dimensions": 2})
        served = client.post(PATH, json={"model": MODEL, "input": "a", "dimensions": 3})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "dimensions"
    assert "have 3 values" in refused.json()["error"]["message"]
    assert served.status_code == 200 and embedder.embedded == [_ids("a")]


@pytest.mark.parametrize("failure", [RuntimeError("boom"), asyncio.CancelledError()], ids=["unexpected", "cancelled"])
def test_any_ending_finishes_the_telemetry_log(failure: BaseException) -> None:
    embedder = ScriptedEmbedder()
    embedder.failure = failure
    app = make_app(embedder)
    with TestClient(app, raise_server_exceptions=False) as client:
        with contextlib.suppress(BaseException):
            client.post(PATH, json={"model": MODEL, "input": "a"})
        shown = app.state.hub.recent(10)
    code = "cancelled" if isinstance(failure, asyncio.CancelledError) else "internal"
    assert [(snapshot.state, (snapshot.error or {}).get("code")) for snapshot, _ in shown] == [("failed", code)]
