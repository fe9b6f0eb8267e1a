"""A completion ended by a stop string, through a live swarm (tracker, real llama.cpp workers,
gateway, mTLS): the client gets the text up to the stop string with ``finish_reason: stop``, the
tracker stores the request ``completed`` with the very tokens and billing units the client was
told, and the audit replays it like any completion (issue 28: such a request used to be closed
as a cancellation, stored ``cancelled`` and never audited).

Two replicas of each half, so the audit has another route to replay on; ``--audit-fraction 1``
so every completed request is audited. The stop string is picked from the whole model's own
answer, so the expected text and token count come from the oracle, not from the swarm.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from swarm_harness import (
    PROMPT,
    Reference,
    Swarm,
    chat_body,
    query_db,
    read_sse,
    stop_string_of,
    write_tiny_model,
)

from meshnet.route.life import billing_units

pytestmark = pytest.mark.timeout(180)

MAX_TOKENS = 32
WAIT_S = 60.0


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory, model: Path) -> Iterator[Swarm]:
    with Swarm(tmp_path_factory.mktemp("swarm"), model) as running:
        running.start_tracker()
        running.start_workers("0:3", "0:3", "3:6", "3:6")
        running.start_gateway("--audit-fraction", "1")
        running.wait_routable(nodes=4)
        yield running


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory, model: Path) -> tuple[str, str, int, int]:
    """(stop string, the text before it, tokens up to and with the one completing it, prompt tokens)."""
    reference = Reference(model, tmp_path_factory.mktemp("reference"))
    try:
        prompt = reference.chat_tokens(PROMPT)
        tokens = reference.generate(prompt, MAX_TOKENS)
        text = reference.text(tokens)
        stop, start = stop_string_of(text)
        ends = next(n for n in range(1, len(tokens) + 1) if stop in reference.text(tokens[:n]))
        return stop, text[:start], ends, len(prompt)
    finally:
        reference.close()


def _base_url(swarm: Swarm) -> str:
    return swarm.gateways[0].ready_line.split()[3]


def _ask(swarm: Swarm, stop: str, *, stream: bool) -> tuple[str, str, str, dict[str, Any]]:
    """(request id, text, finish reason, usage) of one chat completion with ``stop``."""
    body = {**chat_body(MAX_TOKENS, stream=stream), "stop": [stop]}
    if not stream:
        reply = httpx.post(_base_url(swarm) + "/v1/chat/completions", json=body, headers=swarm.auth, timeout=60)
        assert reply.status_code == 200, reply.text
        whole = reply.json()
        choice = whole["choices"][0]
        return reply.headers["x-request-id"], choice["message"]["content"], choice["finish_reason"], whole["usage"]
    body["stream_options"] = {"include_usage": True}
    result = read_sse(_base_url(swarm), "/v1/chat/completions", body, headers=swarm.auth)
    assert result.status == 200, result.items
    chunks = [item.payload for item in result.items if item.kind == "chunk"]
    finish = [c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c["finish_reason"]]
    [usage] = [chunk["usage"] for chunk in chunks if chunk.get("usage")]
    return result.request_id, result.text, finish[-1], usage


def _audits(swarm: Swarm) -> dict[str, float]:
    text = httpx.get(_base_url(swarm) + "/metrics", timeout=5).text
    prefix = "meshnet_gateway_audits_"
    counts = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            name, value = line.split()
            counts[name.removeprefix(prefix).removesuffix("_total")] = float(value)
    return counts


def _record(swarm: Swarm, request_id: str) -> tuple[Any, ...]:
    """(status, tokens_in, tokens_out, billing_units) of the request's work record, once stored."""
    query = f"SELECT status, tokens_in, tokens_out, billing_units FROM work_records WHERE request_id = '{request_id}'"
    deadline = time.monotonic() + WAIT_S
    while not (rows := query_db(swarm.db_path, query)) or rows[0][0] == "unverified":
        assert time.monotonic() < deadline, f"the tracker never stored the outcome of {request_id}: {rows}"
        time.sleep(0.1)
    return rows[0]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_stop_string_completion_is_stored_completed_billed_as_told_and_audited(
    swarm: Swarm, oracle: tuple[str, str, int, int], stream: bool
) -> None:
    stop, before_stop, tokens, prompt = oracle
    audited = _audits(swarm)
    request_id, text, finish, usage = _ask(swarm, stop, stream=stream)
    assert (text, finish) == (before_stop, "stop")
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (prompt, tokens)
    assert usage["billing_units"] == billing_units(prompt, tokens)
    record = _record(swarm, request_id)
    assert record == ("completed", usage["prompt_tokens"], usage["completion_tokens"], usage["billing_units"])
    deadline = time.monotonic() + WAIT_S
    while _audits(swarm).get("clean", 0) < audited.get("clean", 0) + 1:
        assert time.monotonic() < deadline, f"the request was never audited: {_audits(swarm)}"
        time.sleep(0.1)
    assert _audits(swarm).get("sampled", 0) == audited.get("sampled", 0) + 1
    assert _record(swarm, request_id)[0] == "completed"  # the audit agreed: nothing to mark
