"""Conversations stay on the route that holds their prefix (issue 31, item 2), on a real swarm:
tracker, two equally fast whole-model workers that keep prompt prefixes, a gateway, over mTLS.

Each turn of a conversation resends its history, so its prompt begins with the previous turn's
prompt; the route that served a turn holds that prefix, and the next turn must go there to reuse
it (``cached_tokens`` > 0), not to the other route, which holds nothing of it. Conversation A
starts on whichever route the tracker picks; B starts while A's route is full (two long requests
of A hold both its sessions), so on the other route; then their turns alternate, and each must
land on its own route. Without prefix-aware routes the tracker sends every turn to its fastest
route, so one conversation's turns leave the route that holds them. Finally, with A's route full
again, A's turn goes to the other route and is served cold, with the whole model's tokens.
Last, the tracker is restarted: the new one remembers no conversation, so a turn finds its
route by what each head announces it holds (its heartbeat's prefix tips).

Both workers wait ``STEP_DELAY_MS`` per step (``boasting_worker.py``, claiming one speed), so the
holding requests are still running when the next request is routed, even on an idle machine.
The tracker counts the sessions it routed to a node since its last heartbeat against the room
that heartbeat reported (a finished one too, until the next heartbeat), so between phases the
test waits for a heartbeat that reports the workers idle (``_settle``).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from swarm_harness import MODEL_NAME, PROMPT, Reference, SseItem, Swarm, read_sse

from meshnet.membership.tracker_client import TrackerClient

pytestmark = pytest.mark.timeout(300)

BOASTER = Path(__file__).with_name("boasting_worker.py")
STEP_DELAY_MS = 4.0
CLAIMED_RATE = 200.0
"""What both workers claim (tok/s): about what they serve at STEP_DELAY_MS a step, and equal, so
a new tracker that measured nothing yet sees two equal routes."""
CHUNK = 16
TOKENS = 8
HOLD_TOKENS = 150
"""A holding request's length: PROMPT's greedy answer runs 200 tokens without EOS."""
TURNS = 4
SESSIONS = 4
"""Each worker's sessions: the holding requests fill them all."""
REPLIES = ("a dog runs fast", "the bird sings", "it rains today", "we go home now")
QUESTIONS = ("where is the bird now", "what does the cat eat", "who is in the garden", "when is the night")


def _conversation(first: str) -> list[list[dict[str, str]]]:
    """Each turn's messages: the whole history so far and one more question."""
    messages = [{"role": "user", "content": first}]
    turns = [list(messages)]
    for reply, question in zip(REPLIES, QUESTIONS, strict=True):
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": question}]
        turns.append(list(messages))
    return turns


@dataclass(frozen=True)
class Served:
    head: str
    cached_tokens: int
    text: str


def _body(messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL_NAME, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "stream": True}


def _ask(swarm: Swarm, url: str, messages: list[dict[str, str]], max_tokens: int = TOKENS) -> Served:
    result = read_sse(url, "/v1/chat/completions", _body(messages, max_tokens), headers=swarm.auth)
    assert result.status == 200, result.items
    (accepted,) = result.telemetry("accepted")
    return Served(accepted["hops"][0]["address"], accepted["cached_tokens"], result.text)


@contextmanager
def _holding(swarm: Swarm, url: str, messages: list[dict[str, str]], count: int) -> Iterator[list[str]]:
    """``count`` long requests of ``messages`` running (their heads listed once each was routed)."""
    heads: list[str] = []
    routed = [threading.Event() for _ in range(count)]

    def run(index: int) -> None:
        def on_item(item: SseItem, _: list[SseItem]) -> None:
            if item.kind == "telemetry" and item.payload["kind"] == "accepted":
                heads.append(item.payload["hops"][0]["address"])
                routed[index].set()

        read_sse(url, "/v1/chat/completions", _body(messages, HOLD_TOKENS), on_item=on_item, headers=swarm.auth)
        routed[index].set()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for index, thread in enumerate(threads):
        thread.start()
        assert routed[index].wait(60.0), "a holding request was never routed"
    try:
        yield heads
    finally:
        for thread in threads:
            thread.join(120.0)


def _settle(swarm: Swarm, since: float, timeout_s: float = 15.0) -> None:
    """Wait for a heartbeat of every worker, sent after ``since`` (monotonic), reporting it idle."""

    async def idle() -> bool:
        asked = time.monotonic()
        async with TrackerClient(swarm.tracker_address, security=swarm.security) as client:
            nodes = (await client.list_nodes()).nodes
        return all(n.seconds_since_heartbeat < asked - since and n.load.active_sessions == 0 for n in nodes)

    deadline = time.monotonic() + timeout_s
    while not asyncio.run(idle()):
        assert time.monotonic() < deadline, "the workers did not report idle"
        time.sleep(0.05)


def test_conversations_stick_to_the_route_holding_their_prefix_and_leave_it_when_full(
    tmp_path: Path, model: Path
) -> None:
    reference = Reference(model, tmp_path / "reference")
    a_turns, b_turns = _conversation(PROMPT), _conversation("a red fox jumps over the lazy brown dog")

    def expected(messages: list[dict[str, str]]) -> str:
        return reference.text(reference.generate(reference.tokenizer.encode_chat(messages), TOKENS))

    lag = ("--step-delay-ms", str(STEP_DELAY_MS), "--claim-rate", str(CLAIMED_RATE))
    program = (sys.executable, str(BOASTER), *lag, "--")
    with Swarm(tmp_path / "swarm", model) as swarm:
        swarm.start_tracker()
        swarm.start_workers("0:6", "0:6", program=program, prefill_chunk=CHUNK, max_sessions=SESSIONS)
        # No turn warm-ups (``route.warmup``): the test counts every session routed against each
        # worker's few slots, and a warm-up is one more per turn, unasked for by the test.
        url = swarm.start_gateway(warm_turns=False)
        swarm.wait_routable(nodes=2)
        # The gateway learns the recipe and chunk chains are keyed by from its first route.
        _ask(swarm, url, [{"role": "user", "content": "warm up the gateway"}])
        a_first = _ask(swarm, url, a_turns[0])
        _settle(swarm, time.monotonic())
        with _holding(swarm, url, a_turns[0], SESSIONS) as held:
            assert held == [a_first.head] * SESSIONS, "a repeated prompt is a turn of its conversation"
            b_first = _ask(swarm, url, b_turns[0])
        assert b_first.head != a_first.head, "a full route takes no new conversation"
        _settle(swarm, time.monotonic())
        served = {}
        for turn in range(1, TURNS + 1):
            for name, turns in (("a", a_turns), ("b", b_turns)):
                served[name, turn] = _ask(swarm, url, turns[turn])
        _settle(swarm, time.monotonic())
        with _holding(swarm, url, a_turns[0], SESSIONS) as held:
            cold = _ask(swarm, url, a_turns[1])
        # A new tracker remembers no conversation: the heads' announcements route the turns. Both
        # claim one speed and none is measured yet, so without tips the planner's tie goes to the
        # lower node id: ask the conversation held by the other one (B's route holds A's turn 1
        # now, but A's route holds its longer last turn).
        swarm.restart_tracker()
        swarm.wait_routable(nodes=2)
        _settle(swarm, time.monotonic())
        ids = {worker.address: worker.node_id for worker in swarm.workers}
        asked, turns, holder = max(
            (("a", a_turns, a_first.head), ("b", b_turns, b_first.head)), key=lambda c: ids[c[2]]
        )
        announced = _ask(swarm, url, turns[TURNS])
    try:
        wanted = {(name, turn): expected((a_turns if name == "a" else b_turns)[turn]) for name, turn in served}
        wanted_cold = expected(a_turns[1])
    finally:
        reference.close()
    heads = {key: s.head for key, s in served.items()}
    print(f"A on {a_first.head}, B on {b_first.head}; turns: {heads}")
    print(f"cached tokens: { {key: s.cached_tokens for key, s in served.items()} }")
    assert all(served["a", turn].head == a_first.head for turn in range(1, TURNS + 1)), heads
    assert all(served["b", turn].head == b_first.head for turn in range(1, TURNS + 1)), heads
    assert all(s.cached_tokens > 0 for s in served.values()), served
    assert {key: s.text for key, s in served.items()} == wanted, "a reused prefix changed the text"
    assert held == [a_first.head] * SESSIONS
    assert cold.head == b_first.head and cold.cached_tokens == 0, cold
    assert cold.text == wanted_cold
    assert announced.head == holder and announced.cached_tokens > 0, f"{asked}: after the restart only tips tell"
