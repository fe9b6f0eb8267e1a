"""Issue 33 end to end on loopback: a worker behind NAT served through real relay processes.

A secured swarm (tracker, gateway, three worker processes on the synthetic tiny GGUF, two
``meshnet relay`` processes, every link mTLS with the swarm's certificates): the middle worker
runs ``--reachability private --relay R1,R2``, so it registers ``NODE@R1`` and every hop into it
runs its TLS session end to end through R1.
- Greedy output through the relayed route equals whole-model llama.cpp.
- R1 SIGKILLed mid-stream: the worker re-attaches to R2 and registers ``NODE@R2`` at once, and
  the request fails over onto it (the route driver's failover, as for any lost hop, replaying
  the history) with output identical to the whole model.
- R2 SIGKILLed mid-stream, no relay left: the stream ends with a typed error event and
  ``[DONE]`` within 5 s, and the worker is listed private (not routed).

Measured figures are printed (run with ``-s``).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from relay_harness import RelayProcess
from swarm_harness import PROMPT, Reference, SseItem, Swarm, Worker, chat_body, read_sse

from meshnet.core.swarm_status import NodeStatus
from meshnet.membership.tracker_client import TrackerClient
from meshnet.node.peers import PeerProber
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire.frames import DEFAULT_MAX_FRAME_BYTES

pytestmark = pytest.mark.timeout(240)

MAX_TOKENS = 120
KILL_AFTER_TOKENS = 30
ERROR_WITHIN_S = 5.0


@dataclass
class PrivateSwarm:
    swarm: Swarm
    relays: list[RelayProcess]
    private: Worker
    base_url: str

    def node(self) -> NodeStatus:
        found = self.listed()
        assert found is not None, f"{self.private.node_id} is not registered"
        return found

    def listed(self) -> NodeStatus | None:
        async def ask() -> NodeStatus | None:
            async with TrackerClient(self.swarm.tracker_address, security=self.swarm.security) as client:
                table = await client.list_nodes()
            return next((node for node in table.nodes if node.node_id == self.private.node_id), None)

        return asyncio.run(ask())

    def await_reachability(self, reachability: str, timeout_s: float) -> NodeStatus:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.listed()
            if found is not None and found.reachability == reachability:
                return found
            time.sleep(0.1)
        return self.node()

    def relayed_at(self, relay: RelayProcess) -> str:
        return f"{self.private.node_id}@{relay.address}"


@pytest.fixture(scope="module")
def expected(reference: Reference) -> str:
    return reference.text(reference.generate(reference.chat_tokens(PROMPT), MAX_TOKENS))


@pytest.fixture(scope="module")
def private_swarm(tmp_path_factory: pytest.TempPathFactory, model: Path) -> Iterator[PrivateSwarm]:
    with Swarm(tmp_path_factory.mktemp("swarm"), model) as swarm:
        swarm.start_tracker()
        relays = [RelayProcess.start(swarm.root, "relay-1"), RelayProcess.start(swarm.root, "relay-2")]
        try:
            swarm.start_workers("0:2", "4:6")
            relay_list = tuple(relay.address for relay in relays)
            (private,) = swarm.start_workers("2:4", reachability="private", relay=relay_list)
            swarm.wait_routable(nodes=3)  # the private worker counts once it is relayed
            yield PrivateSwarm(swarm, relays, private, swarm.start_gateway())
        finally:
            for relay in relays:
                relay.component.stop()


async def round_trip_ms(address: str, swarm: Swarm) -> float | None:
    pool = ChannelPool(DEFAULT_MAX_FRAME_BYTES, swarm.security)
    try:
        return await PeerProber(pool).measure(address)
    finally:
        await pool.close()


class RelayKiller:
    """Reads the stream; after ``after`` text chunks, SIGKILLs ``relay``."""

    def __init__(self, relay: RelayProcess, after: int) -> None:
        self.relay = relay
        self.after = after
        self.killed_at: float | None = None
        self._chunks = 0

    def __call__(self, item: SseItem, items: list[SseItem]) -> None:
        if item.kind == "chunk" and item.text:
            self._chunks += 1
            if self._chunks == self.after and self.killed_at is None:
                self.relay.component.kill(signal.SIGKILL)
                self.killed_at = time.monotonic()


def test_the_private_worker_registers_its_relayed_address_and_serves_whole_model_output(
    private_swarm: PrivateSwarm, expected: str
) -> None:
    at_first = private_swarm.relayed_at(private_swarm.relays[0])
    node = private_swarm.node()
    assert (node.record.address, node.reachability) == (at_first, "relayed")
    assert node.reachability_words == f"relayed via {private_swarm.relays[0].address}"
    swarm = private_swarm.swarm
    rtt_ms = asyncio.run(round_trip_ms(at_first, swarm))  # what the head's probe reports of the seam
    print(f"\nround trip through the relay: {rtt_ms} ms")
    assert rtt_ms is not None and rtt_ms > 0
    result = read_sse(private_swarm.base_url, "/v1/chat/completions", chat_body(MAX_TOKENS), headers=swarm.auth)
    assert result.text == expected, "the relayed route must equal the whole-model reference"
    hops = result.telemetry("accepted")[0]["hops"]
    assert [hop["address"] for hop in hops][1] == at_first


def test_a_relay_killed_mid_stream_moves_the_worker_and_the_request_fails_over_identically(
    private_swarm: PrivateSwarm, expected: str
) -> None:
    first, second = private_swarm.relays
    killer = RelayKiller(first, KILL_AFTER_TOKENS)
    swarm = private_swarm.swarm
    body = chat_body(MAX_TOKENS)
    result = read_sse(private_swarm.base_url, "/v1/chat/completions", body, on_item=killer, headers=swarm.auth)
    assert killer.killed_at is not None, "the stream ended before the kill"
    failover = next(i for i in result.items if i.kind == "telemetry" and i.payload["kind"] == "route_health")
    resumed = next(i for i in result.items[result.items.index(failover) :] if i.text)
    announced, replaced = (1000 * (item.at - killer.killed_at) for item in (failover, resumed))
    print(
        f"\nrelay killed after {KILL_AFTER_TOKENS} tokens: failover announced {announced:.0f} ms, "
        f"first replacement token {replaced:.0f} ms after the kill"
    )
    assert not [item for item in result.items if item.kind == "error"]
    assert result.text == expected, "the failed-over answer must equal the whole-model reference"
    accepted = result.telemetry("accepted")
    assert [hops["hops"][1]["address"] for hops in accepted] == [
        private_swarm.relayed_at(first),
        private_swarm.relayed_at(second),
    ]
    assert accepted[1]["epoch"] > accepted[0]["epoch"]
    node = private_swarm.node()
    assert (node.record.address, node.reachability) == (private_swarm.relayed_at(second), "relayed")


def test_with_no_relay_left_the_request_ends_with_a_typed_error_within_5_s(private_swarm: PrivateSwarm) -> None:
    (_, second) = private_swarm.relays
    assert second.component.alive, "runs after the first relay was killed"
    killer = RelayKiller(second, KILL_AFTER_TOKENS)
    swarm = private_swarm.swarm
    body = chat_body(MAX_TOKENS)
    result = read_sse(private_swarm.base_url, "/v1/chat/completions", body, on_item=killer, headers=swarm.auth)
    assert killer.killed_at is not None, "the stream ended before the kill"
    errors = [item for item in result.items if item.kind == "error"]
    assert errors, [item.kind for item in result.items[-5:]]
    took = errors[0].at - killer.killed_at
    print(f"\nno relay left: error {errors[0].payload['error']['code']} {1000 * took:.0f} ms after the kill")
    assert errors[0].payload["error"]["code"] in {"worker_lost", "no_route"}
    assert took <= ERROR_WITHIN_S
    assert [item.kind for item in result.items[-1:]] == ["done"]
    node = private_swarm.await_reachability("private", timeout_s=5.0)
    assert node.reachability_words == "private: behind NAT, no relay attached"


def test_an_auto_worker_whose_address_does_not_answer_is_found_private_and_attaches_to_its_relay(
    private_swarm: PrivateSwarm, expected: str
) -> None:
    """``--reachability auto`` (the default) with an ``--advertise`` nothing answers at (a port
    behind NAT, say): the tracker registers it private, it attaches to its relay and registers
    again as relayed, and requests route through it with whole-model output."""
    swarm = private_swarm.swarm
    relay = RelayProcess.start(swarm.root, "relay-3")
    try:
        (auto,) = swarm.start_workers("2:4", advertise="127.0.0.1:9", relay=(relay.address,))
        private_swarm.private = auto
        node = private_swarm.await_reachability("relayed", timeout_s=20.0)
        assert (node.record.address, node.reachability) == (private_swarm.relayed_at(relay), "relayed")
        swarm.wait_routable(nodes=3)
        result = read_sse(private_swarm.base_url, "/v1/chat/completions", chat_body(MAX_TOKENS), headers=swarm.auth)
        assert result.text == expected
        assert result.telemetry("accepted")[0]["hops"][1]["address"] == private_swarm.relayed_at(relay)
    finally:
        relay.component.stop()
