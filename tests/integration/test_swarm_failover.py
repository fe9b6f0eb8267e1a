"""W2 and W3: SIGKILL the middle worker of a live route while the gateway streams an answer.

W2 (a spare serves the middle range): the stream goes on, a ``route_health`` failover event
appears, the next client-visible event arrives within 3 s of the kill, and the whole answer is
identical to the no-failure run, greedy and seeded-sampled alike. W3 (no spare): the stream ends
with an error event ``worker_lost`` or ``no_route`` and ``[DONE]`` within 5 s, and the surviving
workers free the session within 1 s.

Measured figures are printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from swarm_harness import (
    PROMPT,
    SAMPLED_SEED,
    MiddleKiller,
    Reference,
    SseResult,
    Swarm,
    chat_body,
    read_sse,
    wait_sessions_freed,
)

from meshnet.core.events import RouteAccepted, RouteHealth
from meshnet.core.generation import GenerationRequest, SamplingParams
from meshnet.core.ids import new_request_id
from meshnet.core.sampling_options import LogitAdjustments, LogprobRequest, TokenLogprobs
from meshnet.gateway.logprob_format import chat_logprobs, logprob_entry
from meshnet.membership.tracker_client import TrackerClient
from meshnet.route.driver import RouteDriver
from meshnet.route.life import Failure, LifeItem, Outcome, TextPiece, TokenText
from meshnet.route.shard_stream import ChannelPool
from meshnet.route.swarm import SwarmClient, SwarmConfig

pytestmark = pytest.mark.timeout(90)

MAX_TOKENS = 200
KILL_AFTER_TOKENS = {0.0: 40, 0.8: 113}
"""Different points per case, so the replay covers short and long histories."""
NEXT_EVENT_WITHIN_S = 3.0
ERROR_WITHIN_S = 5.0
FREED_WITHIN_S = 1.0


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory, model: Path) -> Iterator[Swarm]:
    with Swarm(tmp_path_factory.mktemp("swarm"), model) as running:
        running.start_tracker()
        running.start_workers("0:2", "2:4", "2:4", "4:6")
        running.start_gateway()
        yield running


@pytest.fixture(scope="module")
def base_url(swarm: Swarm) -> str:
    return swarm.gateways[0].ready_line.split()[3]


def with_middle_workers(swarm: Swarm, count: int) -> None:
    """Exactly ``count`` live workers on 2:4, and the tracker routing over just the live ones."""
    swarm.settle()
    middles = swarm.live_workers("2:4")
    if len(middles) < count:
        swarm.start_workers(*["2:4"] * (count - len(middles)))
    for extra in middles[count:]:
        extra.component.stop()
    swarm.wait_routable(nodes=2 + count)


def sampling_for(temperature: float) -> tuple[SamplingParams, int | None]:
    if temperature == 0:
        return SamplingParams(), None
    return SamplingParams(temperature=temperature, seed=SAMPLED_SEED), SAMPLED_SEED


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "seeded"])
def test_w2_failover_to_spare_continues_identically(
    swarm: Swarm, base_url: str, reference: Reference, temperature: float
) -> None:
    sampling, seed = sampling_for(temperature)
    expected = reference.text(reference.generate(reference.chat_tokens(PROMPT), MAX_TOKENS, sampling))
    body = chat_body(MAX_TOKENS, temperature=temperature, seed=seed)
    with_middle_workers(swarm, 2)
    undisturbed = read_sse(base_url, "/v1/chat/completions", body, headers=swarm.auth)
    assert undisturbed.text == expected, "the no-failure run must equal the whole-model reference"
    assert not undisturbed.telemetry("route_health")

    killer = MiddleKiller(swarm, KILL_AFTER_TOKENS[temperature])
    result = read_sse(base_url, "/v1/chat/completions", body, on_item=killer, headers=swarm.auth)

    # Items already in flight when the kill landed may arrive first; the failover is announced by
    # route_health, and the first token after it is the first one the replacement route made.
    after = killer.after_kill(result)
    assert after, "nothing arrived after the kill"
    failover = next(i for i in after if i.kind == "telemetry" and i.payload["kind"] == "route_health")
    resumed = next(i for i in after[after.index(failover) :] if i.text)
    gaps = [(item.at - killer.killed_at) * 1000 for item in (after[0], failover, resumed)]  # type: ignore[operator]
    print(
        f"\nW2 {'greedy' if temperature == 0 else 'seeded'} (kill after {killer.after} tokens): next event "
        f"{gaps[0]:.0f} ms, route_health {gaps[1]:.0f} ms, first replacement token {gaps[2]:.0f} ms after the kill"
    )
    assert max(gaps) <= NEXT_EVENT_WITHIN_S * 1000

    health = result.telemetry("route_health")
    assert [event["status"] for event in health] == ["failover"], health
    accepted = result.telemetry("accepted")
    assert len(accepted) == 2, accepted
    replacement = accepted[1]["hops"]
    assert replacement[1]["address"] != killer.killed_address
    assert [hop["layers"] for hop in replacement] == ["0:2", "2:4", "4:6"]
    assert accepted[1]["epoch"] > accepted[0]["epoch"], "a changed route must carry a larger epoch"
    assert [item.kind for item in result.items[-1:]] == ["done"]
    assert not [item for item in result.items if item.kind == "error"]
    assert result.telemetry()[-1]["kind"] == "completed"
    assert result.telemetry()[-1]["usage"]["completion_tokens"] == MAX_TOKENS
    assert result.text == expected == undisturbed.text


IDLE_AFTER_KILL_S = 0.5


class _PausingClient:
    """The client side of ``_drive_with_pause``: a text plug that records each token id, and a
    sink that keeps the route notes; after ``kill_after`` tokens it SIGKILLs the middle hop and
    holds the event loop, so the route sees the death while its client side is idle."""

    def __init__(self, swarm: Swarm, kill_after: int) -> None:
        self.swarm = swarm
        self.kill_after = kill_after
        self.tokens: list[int] = []
        self.notes: list[object] = []

    def push(self, token_id: int) -> TextPiece:
        self.tokens.append(token_id)
        return TextPiece("")

    def flush(self) -> str:
        return ""

    def put(self, item: LifeItem) -> None:
        if isinstance(item, RouteAccepted | RouteHealth | Outcome | Failure):
            self.notes.append(item)
        if isinstance(item, TokenText) and item.generated == self.kill_after:
            first = next(note for note in self.notes if isinstance(note, RouteAccepted))
            self.swarm.worker_at(first.hops[1].address).component.kill(signal.SIGKILL)
            # Blocking on purpose: nothing of the client runs (no read, no write) meanwhile.
            time.sleep(IDLE_AFTER_KILL_S)


async def _drive_with_pause(
    swarm: Swarm, request: GenerationRequest, kill_after: int
) -> tuple[list[int], list[object]]:
    """Drive ``request`` with the swarm client itself, pausing after ``kill_after`` tokens."""
    frame_bytes = 4 * 1024 * 1024
    pool = ChannelPool(frame_bytes, swarm.security)
    tracker = TrackerClient(swarm.tracker_address, security=swarm.security)
    client = SwarmClient(tracker, pool, RouteDriver(pool, max_frame_bytes=frame_bytes), SwarmConfig())
    pausing = _PausingClient(swarm, kill_after)
    try:
        await client.serve(request, new_request_id(), pausing, pausing)
        await client.drain_reports(timeout_s=5)
    finally:
        await tracker.close()
        await pool.close()
    return pausing.tokens, pausing.notes


def test_w2_middle_dies_while_the_route_is_idle(swarm: Swarm, reference: Reference) -> None:
    """The head learns of the death before its next write, not while awaiting an answer."""
    with_middle_workers(swarm, 2)
    request = GenerationRequest(
        reference.chat_tokens(PROMPT),
        MAX_TOKENS,
        SamplingParams(),
        reference.tokenizer.eos_token_ids,
        model=swarm.model_name,
    )
    expected = reference.generate(request.prompt_tokens, MAX_TOKENS)
    tokens, notes = asyncio.run(_drive_with_pause(swarm, request, kill_after=60))
    assert [type(note).__name__ for note in notes] == ["RouteAccepted", "RouteHealth", "RouteAccepted", "Outcome"]
    assert tokens == [token for token in expected if token not in request.stop_tokens]


def test_w3_no_spare_ends_with_worker_lost_and_frees_sessions(swarm: Swarm, base_url: str) -> None:
    with_middle_workers(swarm, 1)
    killer = MiddleKiller(swarm, KILL_AFTER_TOKENS[0.0])
    result = read_sse(base_url, "/v1/chat/completions", chat_body(MAX_TOKENS), on_item=killer, headers=swarm.auth)

    after = killer.after_kill(result)
    kinds = [item.kind for item in result.items]
    assert kinds[-2:] == ["error", "done"], kinds[-5:]
    error = result.items[-2].payload["error"]
    assert error["code"] in ("worker_lost", "no_route"), error
    assert error["request_id"] == result.request_id
    to_done = result.items[-1].at - killer.killed_at  # type: ignore[operator]
    assert after[-1] is result.items[-1]
    survivors = [hop["address"] for hop in killer.hops if hop["address"] != killer.killed_address]
    freed = wait_sessions_freed(survivors, FREED_WITHIN_S, swarm.security)
    print(
        f"\nW3: error {error['code']!r} and [DONE] {to_done * 1000:.0f} ms after the kill; "
        f"survivors idle {freed * 1000:.0f} ms after [DONE]"
    )
    assert to_done <= ERROR_WITHIN_S
    failed = result.telemetry()[-1]
    assert failed["kind"] == "failed" and failed["code"] == error["code"]


def _logprobs(result: SseResult) -> list[Any]:
    return [
        entry
        for item in result.items
        if item.kind == "chunk"
        for choice in item.payload["choices"]
        if choice.get("logprobs")
        for entry in choice["logprobs"]["content"]
    ]


def test_w2_failover_rebuilds_the_tails_penalties_and_logprobs(
    swarm: Swarm, base_url: str, reference: Reference
) -> None:
    """The replacement tail re-samples the replayed history, so its penalty counts (and a
    grammar's state) end up where the lost tail's were: the answer and its logprobs equal the
    in-process whole model's, which chooses with the tail's own sampler."""
    with_middle_workers(swarm, 2)
    eos = sorted(reference.tokenizer.eos_token_ids)
    # No end of text, so the answer runs long enough to lose a worker in the middle.
    no_eos = tuple((token, -100.0) for token in eos)
    penalties = LogitAdjustments(presence_penalty=0.3, frequency_penalty=0.4, logit_bias=no_eos)
    sampling = SamplingParams(temperature=0.8, seed=SAMPLED_SEED, adjustments=penalties, logprobs=LogprobRequest(3))
    prompt = reference.chat_tokens(PROMPT)
    expected = reference.choices(prompt, MAX_TOKENS, sampling)
    unpenalised = replace(sampling, adjustments=LogitAdjustments(logit_bias=no_eos))
    # Were penalties ignored on either side, the two sides would differ: the oracle's answer
    # with them is not its answer without them.
    assert [token for token, _ in expected] != reference.generate(prompt, MAX_TOKENS, unpenalised)
    body = {
        **chat_body(MAX_TOKENS, temperature=0.8, seed=SAMPLED_SEED),
        "frequency_penalty": 0.4,
        "presence_penalty": 0.3,
        "logprobs": True,
        "top_logprobs": 3,
        "logit_bias": {str(token): -100 for token in eos},
    }
    killer = MiddleKiller(swarm, 50)
    result = read_sse(base_url, "/v1/chat/completions", body, on_item=killer, headers=swarm.auth)
    assert [event["status"] for event in result.telemetry("route_health")] == ["failover"]
    assert not [item for item in result.items if item.kind == "error"]
    assert result.text == reference.text([token for token, _ in expected])
    assert _logprobs(result) == _oracle_logprobs(reference, expected)


def _oracle_logprobs(reference: Reference, expected: list[tuple[int, TokenLogprobs | None]]) -> list[Any]:
    """The oracle's logprobs as the gateway reports them (its own formatter, over the oracle's values)."""
    entries = [logprob_entry(logprobs, reference.tokenizer) for _, logprobs in expected if logprobs is not None]
    assert len(entries) == len(expected)
    return chat_logprobs(entries)["content"]  # type: ignore[no-any-return]
