"""K1 on the whole swarm: kill -9 the tracker while requests run, restart it on the same --db.

Requests already routed keep generating while the tracker is down; the gateway must not lose
the work records of those that finish meanwhile. The kill waits for a long streamed request to
be generating, so one request always finishes during the outage: background clients alone can
all be between route calls at the moment of the kill (seen in CI, where the first requests after
start-up are slow and the kill fell on the next round's route calls). After the restart (same port, same SQLite
file) every completed request id is stored exactly once, workers re-register within a few
heartbeats, and new requests route again.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from swarm_harness import Swarm, chat_body, query_db, write_tiny_model

pytestmark = pytest.mark.timeout(90)

CLIENTS = 3
MAX_TOKENS = 24
WITNESS_TOKENS = 96
"""The request generating when the tracker dies: long enough (about a second on the tiny model)
that it is still generating when the kill lands after its first token."""
OUTAGE_S = 6.0
"""Extra time the tracker stays dead, on top of the restarted process's own start-up: longer
than one report attempt's budget (ReportPolicy.timeout_s, 5 s) plus gRPC's own retries. A
duration the scenario is made of, not a wait for something to happen."""
TRAFFIC_WITHIN_S = 30.0
"""Bound on waiting for a request to complete before the kill and after the restart."""
SERVING_WITHIN_S = 2.0
DRAIN_WITHIN_S = 30.0


@dataclass(frozen=True)
class Outcome:
    request_id: str
    status: int
    started: float
    finished: float
    tokens: int = MAX_TOKENS


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[Swarm]:
    with Swarm(tmp_path, write_tiny_model(tmp_path)) as running:
        running.start_tracker()
        running.start_workers("0:2", "2:4", "4:6")
        running.start_gateway()
        running.wait_routable(nodes=3)
        yield running


def _traffic(base_url: str, stop: threading.Event, outcomes: list[Outcome], auth: dict[str, str]) -> None:
    with httpx.Client(timeout=30, headers=auth) as client:
        while not stop.is_set():
            started = time.monotonic()
            response = client.post(base_url + "/v1/chat/completions", json=chat_body(MAX_TOKENS, stream=False))
            outcomes.append(Outcome(response.headers["x-request-id"], response.status_code, started, time.monotonic()))
            if response.status_code != 200:
                time.sleep(0.05)  # no route while the tracker is down: don't spin


def _witness(base_url: str, generating: threading.Event, outcomes: list[Outcome], auth: dict[str, str]) -> None:
    """One streamed request that signals its first token, then reads to the end."""
    with httpx.Client(timeout=30, headers=auth) as client:
        started = time.monotonic()
        body = chat_body(WITNESS_TOKENS, stream=True)
        with client.stream("POST", base_url + "/v1/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    generating.set()
            request_id = response.headers["x-request-id"]
            outcomes.append(Outcome(request_id, response.status_code, started, time.monotonic(), WITNESS_TOKENS))
    generating.set()  # a refused witness must not leave the test waiting


def _wait_for(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TRAFFIC_WITHIN_S
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def _stored_ids(db: Path) -> list[str]:
    return [row[0] for row in query_db(db, "SELECT request_id FROM work_records WHERE status = 'completed'")]


def test_tracker_kill9_loses_and_duplicates_no_work_records(swarm: Swarm) -> None:
    base_url = swarm.gateways[0].ready_line.split()[3]
    outcomes: list[Outcome] = []
    stop = threading.Event()
    clients = [threading.Thread(target=_traffic, args=(base_url, stop, outcomes, swarm.auth)) for _ in range(CLIENTS)]
    generating = threading.Event()
    for thread in clients:
        thread.start()
    try:
        _wait_for("a completed request before the kill", lambda: any(o.status == 200 for o in outcomes))
        clients.append(threading.Thread(target=_witness, args=(base_url, generating, outcomes, swarm.auth)))
        clients[-1].start()
        assert generating.wait(timeout=30), "the witness request never started generating"
        assert swarm.tracker is not None
        swarm.tracker.kill(signal.SIGKILL)
        killed_at = time.monotonic()
        swarm.tracker.process.wait(timeout=5)
        time.sleep(OUTAGE_S)
        swarm.start_tracker(port=swarm.tracker_port)
        ready_at = time.monotonic()
        swarm.wait_routable(nodes=3, timeout_s=10)
        serving_after = time.monotonic() - ready_at
        _wait_for(
            "a request served after the restart",
            lambda: any(o.status == 200 and o.started > ready_at for o in outcomes),
        )
    finally:
        stop.set()
        for thread in clients:
            thread.join(timeout=30)

    completed = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status != 200]
    # Requests that finished while the tracker was dead are the ones whose records are at risk.
    during_outage = [o for o in completed if killed_at <= o.finished <= ready_at]
    print(
        f"\nK1: {len(completed)} completed ({len(during_outage)} while the tracker was down), "
        f"{len(refused)} refused; down {ready_at - killed_at:.2f} s; routable {serving_after:.2f} s after restart"
    )
    assert serving_after <= SERVING_WITHIN_S
    assert during_outage, "no request finished during the outage: the test did not exercise it"
    assert {o.status for o in refused} <= {503}, refused
    assert any(o.started > ready_at for o in completed), "no request was served after the restart"

    expected = {o.request_id for o in completed}
    deadline = time.monotonic() + DRAIN_WITHIN_S
    while not expected <= set(_stored_ids(swarm.db_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    stored = Counter(_stored_ids(swarm.db_path))
    missing = expected - set(stored)
    assert not missing, f"{len(missing)} of {len(expected)} completed records lost: {sorted(missing)[:5]}"
    assert not [rid for rid, count in stored.items() if count > 1]
    assert set(stored) == expected, "a record for a request the client never saw complete"
    shares = dict(query_db(swarm.db_path, "SELECT request_id, count(*) FROM work_shares GROUP BY request_id"))
    assert all(shares[rid] == 3 for rid in expected), "each record attributes its three hops once"
    tokens = dict(query_db(swarm.db_path, "SELECT request_id, tokens_out FROM work_records"))
    assert all(tokens[o.request_id] == o.tokens for o in completed)
