"""A lost middle shard's session resumes from its KV snapshot on the spare that replaces it.

Secured swarm of real processes (tracker, gateway, workers 0:2, 2:4, 2:4, 4:6), every worker
snapshotting its sessions every ``EVERY`` positions (``--snapshot-every``); each middle copies
its snapshots to the other (the one live peer of its recipe and range, found in the tracker's
node table). The middle of a live route is SIGKILLed past position ``EVERY``: the replacement
route restores the snapshot on every hop (the spare restores the copy the lost middle sent it),
replays only the tokens after it, and the answer equals the whole model's. The tracker's
database never holds a byte of a snapshot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from swarm_harness import PROMPT, MiddleKiller, Reference, Swarm, chat_body, read_sse, write_tiny_model

from meshnet.core.generation import SamplingParams
from meshnet.core.sampling_options import LogitAdjustments
from meshnet.route.shard_admin import fetch_metrics
from meshnet.route.shard_stream import ChannelPool
from meshnet.session.snapshots import MAGIC

pytestmark = pytest.mark.timeout(180)

EVERY = 256
"""The workers' prefill chunk (the harness's default), so a snapshot lands at 256."""
MAX_TOKENS = 400
KILL_AFTER = 300
"""Text chunks before the kill: the session is then past position EVERY."""
PEER_WITHIN_S = 15.0


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    model = write_tiny_model(tmp_path_factory.mktemp("model"))
    with Swarm(tmp_path_factory.mktemp("swarm"), model) as running:
        running.start_tracker()
        running.start_workers("0:2", "2:4", "2:4", "4:6", snapshot_every=EVERY, snapshot_disk_mb=16)
        running.start_gateway()
        yield running


def _metrics(swarm: Swarm, addresses: list[str]) -> list[dict[str, float]]:
    async def fetch() -> list[dict[str, float]]:
        pool = ChannelPool(4 << 20, swarm.security)
        try:
            return list(await asyncio.gather(*(fetch_metrics(pool, address) for address in addresses)))
        finally:
            await pool.close()

    return asyncio.run(fetch())


def _wait_for_peers(swarm: Swarm) -> None:
    """Until each middle knows the other as the peer that keeps its snapshots' copies."""
    middles = [worker.address for worker in swarm.live_workers("2:4")]
    deadline = time.monotonic() + PEER_WITHIN_S
    while not all(values["snapshot_peer"] == 1.0 for values in _metrics(swarm, middles)):
        assert time.monotonic() < deadline, "the middles found no snapshot peer in the tracker's node table"
        time.sleep(0.1)


def test_failover_resumes_from_the_lost_middles_snapshot_copy(swarm: Swarm, tmp_path: Path) -> None:
    swarm.wait_routable(nodes=4)
    _wait_for_peers(swarm)
    reference = Reference(swarm.model, tmp_path / "reference")
    try:
        eos = sorted(reference.tokenizer.eos_token_ids)
        sampling = SamplingParams(adjustments=LogitAdjustments(logit_bias=tuple((t, -100.0) for t in eos)))
        expected = reference.text(reference.generate(reference.chat_tokens(PROMPT), MAX_TOKENS, sampling))
    finally:
        reference.close()
    body = {**chat_body(MAX_TOKENS), "logit_bias": {str(token): -100 for token in eos}}
    killer = MiddleKiller(swarm, KILL_AFTER)
    result = read_sse(
        swarm.gateways[0].ready_line.split()[3], "/v1/chat/completions", body, on_item=killer, headers=swarm.auth
    )

    health = result.telemetry("route_health")
    assert [event["status"] for event in health] == ["failover", "resumed"], health
    assert result.text == expected
    assert result.telemetry()[-1]["usage"]["completion_tokens"] == MAX_TOKENS
    spare = next(w.address for w in swarm.live_workers("2:4"))
    (values,) = _metrics(swarm, [spare])
    assert values["snapshot_copies_kept_total"] >= 1 and values["snapshots_restored_total"] == 1
    assert 0 < values["snapshot_disk_bytes"] <= values["snapshot_disk_budget_bytes"]
    after = killer.after_kill(result)
    failover = next(i for i in after if i.kind == "telemetry" and i.payload["kind"] == "route_health")
    resumed = next(item for item in after[after.index(failover) :] if item.text)
    print(
        f"\nsnapshot failover: first replacement token {(resumed.at - killer.killed_at) * 1000:.0f} ms after the kill"
    )  # type: ignore[operator]
    assert MAGIC not in swarm.db_path.read_bytes(), "a snapshot reached the tracker"
