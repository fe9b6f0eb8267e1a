"""Workers and a gateway given two trackers (``--tracker A,B``) ride out the first one's SIGKILL.

Two real tracker processes of one swarm (one CA, mTLS on every link), each with its own SQLite
database: nothing is shared between them, so this is the client side of failover alone (the
replicas that share membership through a store are the tracker's business). So every worker and
the gateway pins the listed order (``--tracker-order listed``: by default each would start at a
replica of its own, and trackers that share nothing would each see half a swarm). Workers
register with A, the first of their list. A is SIGKILLed: each worker's next heartbeat fails, its client
moves to B and asks the heartbeat again there, B answers "unknown node", and the worker registers
with B after a jittered fraction of an interval. The gateway, still pointed at A, then serves a
request: its route call fails on A and is asked once more of B.

Heartbeats are 2 s apart (not the harness's 0.5 s): a beat's deadline is one interval, and on a
loaded machine half a second is not enough for a live tracker to answer. The test asserts what
the swarm does (who routes, what is served), never how many log lines said so.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from swarm_harness import MISSED_HEARTBEATS, Component, Swarm, chat_body, list_models, write_tiny_model

pytestmark = pytest.mark.timeout(60)

RANGES = ("0:3", "3:6")
HEARTBEAT_S = 2.0
REJOIN_WITHIN_S = (MISSED_HEARTBEATS + 3) * HEARTBEAT_S
"""Bound on the wait for every worker to be routable at B. A worker's next beat is due within an
interval, fails on A and is asked again of B, and the worker registers there after a jittered
fraction of an interval: about two intervals. The bound is the horizon over which a tracker
itself gives up on a silent node (``MISSED_HEARTBEATS`` intervals) with three more of headroom
for a loaded machine."""


def routable_nodes(tracker: str, swarm: Swarm) -> int:
    """How many nodes ``tracker`` (one address, not the list) routes the model over; 0 if none."""
    try:
        models = asyncio.run(list_models(tracker, swarm.security))
    except Exception:  # still starting or gone: the caller's deadline bounds the wait
        return 0
    summary = next((model for model in models if model.name == swarm.model_name), None)
    return summary.nodes if summary is not None and summary.routable else 0


def wait_routable_at(tracker: str, swarm: Swarm, nodes: int, within_s: float) -> float:
    """Seconds until ``tracker`` routes over ``nodes`` nodes (fails after ``within_s``)."""
    started = time.monotonic()
    while routable_nodes(tracker, swarm) != nodes:
        assert time.monotonic() - started < within_s, f"{tracker} never routed over {nodes} nodes"
        time.sleep(0.05)
    return time.monotonic() - started


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[Swarm, Component, str, str]]:
    with Swarm(tmp_path, write_tiny_model(tmp_path), heartbeat_s=HEARTBEAT_S) as swarm:
        first = swarm.start_tracker()
        tracker_a = swarm.tracker
        assert tracker_a is not None
        swarm.tracker_db = tmp_path / "tracker-b.sqlite3"  # a second tracker, a database of its own
        second = swarm.start_tracker()
        swarm.tracker_address = f"{first},{second}"  # what every worker and the gateway are given
        try:
            yield swarm, tracker_a, first, second
        finally:
            tracker_a.stop()


def test_workers_and_the_gateway_move_to_the_next_tracker_when_the_first_dies(
    replicas: tuple[Swarm, Component, str, str],
) -> None:
    swarm, tracker_a, first, second = replicas
    swarm.start_workers(*RANGES, tracker_order="listed")
    gateway = swarm.start_gateway(tracker_order="listed")
    wait_routable_at(first, swarm, len(RANGES), within_s=15)
    assert routable_nodes(second, swarm) == 0  # the workers stick to the first tracker of their list

    with httpx.Client(timeout=30, headers=swarm.auth) as client:
        before = client.post(gateway + "/v1/chat/completions", json=chat_body(8, stream=False))
        assert before.status_code == 200, before.text

        tracker_a.kill(signal.SIGKILL)
        tracker_a.process.wait(timeout=5)
        rejoined_s = wait_routable_at(second, swarm, len(RANGES), within_s=REJOIN_WITHIN_S)

        # One request, never retried by this client: the gateway's own retry on B serves it.
        after = client.post(gateway + "/v1/chat/completions", json=chat_body(8, stream=False))
    print(f"\nworkers routable at B {rejoined_s:.2f} s ({rejoined_s / swarm.heartbeat_s:.1f} heartbeats) after A died")
    assert after.status_code == 200, after.text
    assert after.json()["choices"][0]["message"]["content"] == before.json()["choices"][0]["message"]["content"]
    assert routable_nodes(second, swarm) == len(RANGES)  # and they stayed at B
