"""A hung worker is found fast: SIGSTOP one hop of a live route while the gateway streams.

A frozen process keeps its sockets open (the kernel still acknowledges its TCP segments), so
nothing ends a stream to it but HTTP/2 keepalive; before it fired (grpc waits
``grpc.http2.ping_timeout_ms``, 60 s by default, for a ping's answer) a SIGSTOPped middle went
unnoticed for 61 s. Now, for the head, the middle and the tail alike:

- with a spare of the frozen hop's layers, the client sees the failover (``route_health``)
  within 5 s of the freeze and the whole answer equals the no-failure run (which equals the
  whole-model reference);
- with no spare, the stream ends with a typed error event and ``[DONE]`` within 5 s;
- after SIGCONT, the woken worker frees the stale session by itself and the swarm, with it,
  still answers exactly the reference (nothing it held or sent late corrupts anything).

Real processes and certificates from the swarm CA (``swarm_harness``). Measured figures are
printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from swarm_harness import (
    PROMPT,
    Reference,
    SseItem,
    SseResult,
    Swarm,
    Worker,
    chat_body,
    read_sse,
    wait_sessions_freed,
)

pytestmark = pytest.mark.timeout(180)

RANGES = ("0:2", "2:4", "4:6")
MAX_TOKENS = 200
FREEZE_AFTER_TOKENS = 40
SEEN_WITHIN_S = 5.0
"""The acceptance figure: failover or a typed error within 5 s of the freeze."""
STALE_FREED_WITHIN_S = 10.0
"""After SIGCONT: the woken worker's own transport timers must fire and end the stale session."""
HOPS = {"head": 0, "middle": 1, "tail": 2}


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory, model: Path) -> Iterator[Swarm]:
    with Swarm(tmp_path_factory.mktemp("swarm"), model) as running:
        running.start_tracker()
        running.start_workers(*RANGES)
        running.start_gateway()
        yield running


@pytest.fixture(scope="module")
def base_url(swarm: Swarm) -> str:
    return swarm.gateways[0].ready_line.split()[3]


def with_workers(swarm: Swarm, layers: str, count: int) -> None:
    """Exactly ``count`` live workers on ``layers`` (one on every other range), all routable."""
    swarm.settle()
    for text in RANGES:
        wanted = count if text == layers else 1
        live = swarm.live_workers(text)
        if len(live) < wanted:
            swarm.start_workers(*[text] * (wanted - len(live)))
        for extra in live[wanted:]:
            extra.component.stop()
    swarm.wait_routable(nodes=len(RANGES) - 1 + count)


class Freezer:
    """Reads the stream; after ``after`` text chunks, SIGSTOPs hop ``hop`` of the accepted route."""

    def __init__(self, swarm: Swarm, hop: int, after: int = FREEZE_AFTER_TOKENS) -> None:
        self.swarm = swarm
        self.hop = hop
        self.after = after
        self.hops: list[dict[str, Any]] = []
        self.frozen: Worker | None = None
        self.frozen_at = 0.0
        self._chunks = 0

    def __call__(self, item: SseItem, items: list[SseItem]) -> None:
        if item.kind == "telemetry" and item.payload["kind"] == "accepted" and not self.hops:
            self.hops = item.payload["hops"]
        if item.kind == "chunk" and item.text:
            self._chunks += 1
            if self._chunks == self.after and self.frozen is None:
                self.frozen = self.swarm.worker_at(self.hops[self.hop]["address"])
                self.frozen.component.kill(signal.SIGSTOP)
                self.frozen_at = time.monotonic()

    def after_freeze(self, result: SseResult) -> list[SseItem]:
        assert self.frozen is not None, "the stream ended before the freeze"
        return [item for item in result.items if item.at >= self.frozen_at]

    def thaw(self) -> Worker:
        assert self.frozen is not None
        self.frozen.component.kill(signal.SIGCONT)
        return self.frozen


def stale_session_freed(swarm: Swarm, worker: Worker) -> float:
    """Seconds until the thawed ``worker`` holds no session; AssertionError after the bound."""
    return wait_sessions_freed([worker.address], STALE_FREED_WITHIN_S, swarm.security)


@pytest.mark.parametrize("victim", list(HOPS))
def test_a_frozen_hop_fails_over_within_5_s_and_the_answer_is_unchanged(
    swarm: Swarm, base_url: str, reference: Reference, victim: str
) -> None:
    expected = reference.text(reference.generate(reference.chat_tokens(PROMPT), MAX_TOKENS))
    with_workers(swarm, RANGES[HOPS[victim]], 2)
    body = chat_body(MAX_TOKENS)
    undisturbed = read_sse(base_url, "/v1/chat/completions", body, headers=swarm.auth)
    assert undisturbed.text == expected, "the no-failure run must equal the whole-model reference"

    freezer = Freezer(swarm, HOPS[victim])
    try:
        result = read_sse(base_url, "/v1/chat/completions", body, on_item=freezer, headers=swarm.auth)
    finally:
        thawed = freezer.thaw() if freezer.frozen is not None else None
    after = freezer.after_freeze(result)
    failover = next((i for i in after if i.kind == "telemetry" and i.payload["kind"] == "route_health"), None)
    assert failover is not None, [i.kind for i in after][:20]
    seen_s = failover.at - freezer.frozen_at
    assert thawed is not None
    freed_s = stale_session_freed(swarm, thawed)
    print(
        f"\nfrozen {victim} after {freezer.after} tokens: failover seen {seen_s * 1000:.0f} ms after SIGSTOP; "
        f"the thawed worker freed its stale session {freed_s * 1000:.0f} ms after SIGCONT"
    )
    assert seen_s <= SEEN_WITHIN_S
    assert [event["status"] for event in result.telemetry("route_health")] == ["failover"]
    replacement = result.telemetry("accepted")[-1]["hops"]
    assert replacement[HOPS[victim]]["address"] != thawed.address
    assert not [item for item in result.items if item.kind == "error"]
    assert [item.kind for item in result.items[-1:]] == ["done"]
    assert result.text == expected == undisturbed.text

    # The thawed worker rejoins; whatever it held or sent late corrupts nothing.
    swarm.wait_routable(nodes=len(RANGES) + 1)
    again = read_sse(base_url, "/v1/chat/completions", body, headers=swarm.auth)
    assert again.text == expected


def test_a_frozen_middle_without_spare_ends_with_a_typed_error_within_5_s(swarm: Swarm, base_url: str) -> None:
    with_workers(swarm, "2:4", 1)
    freezer = Freezer(swarm, HOPS["middle"])
    try:
        result = read_sse(base_url, "/v1/chat/completions", chat_body(MAX_TOKENS), on_item=freezer, headers=swarm.auth)
    finally:
        thawed = freezer.thaw() if freezer.frozen is not None else None
    kinds = [item.kind for item in freezer.after_freeze(result)]
    assert kinds[-2:] == ["error", "done"], kinds[-5:]
    error = result.items[-2].payload["error"]
    assert error["code"] in ("worker_lost", "no_route", "timeout"), error
    assert error["retryable"], error
    ended_s = result.items[-1].at - freezer.frozen_at
    survivors = [hop["address"] for index, hop in enumerate(freezer.hops) if index != HOPS["middle"]]
    assert thawed is not None
    freed_s = stale_session_freed(swarm, thawed)
    print(
        f"\nfrozen middle, no spare: {error['code']!r} and [DONE] {ended_s * 1000:.0f} ms after SIGSTOP; "
        f"the thawed middle freed its stale session {freed_s * 1000:.0f} ms after SIGCONT"
    )
    assert ended_s <= SEEN_WITHIN_S
    wait_sessions_freed(survivors, 1.0, swarm.security)
