"""No lost records: work reports queued in a gateway survive its SIGTERM, and its SIGKILL.

SIGTERM: requests finish while the tracker is dead, so their records queue in the gateway; the
gateway is stopped with SIGTERM (its shutdown path must run: exit code 0, not 143) and started
again over the same data directory, and only then does the tracker come back. Every completed
request must then have exactly one ``completed`` record. SIGKILL: a gateway killed mid-stream
leaves the request's written-ahead record, which its successor files as ``unverified``; the tracker
stores it as its route's shards counted it (``completed_by_shards``, tokens and all), not as the
empty claim it is (issue 29: it was ``unverified`` with no tokens out).
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from swarm_harness import SseItem, SseResult, Swarm, chat_body, query_db, read_sse, write_tiny_model

pytestmark = pytest.mark.timeout(150)

CLIENTS = 4
MAX_TOKENS = 160
"""Long enough that every stream is still running when the tracker dies."""
ARRIVE_WITHIN_S = 30.0


def _records(db: Path) -> list[tuple[str, str, int]]:
    return [(row[0], row[1], row[2]) for row in query_db(db, "SELECT request_id, status, tokens_out FROM work_records")]


def _wait_records(db: Path, wanted: set[str]) -> list[tuple[str, str, int]]:
    deadline = time.monotonic() + ARRIVE_WITHIN_S
    while time.monotonic() < deadline:
        try:
            rows = _records(db)
            if wanted <= {row[0] for row in rows}:
                return rows
        except Exception:  # the restarted tracker may be creating its tables
            pass
        time.sleep(0.2)
    raise AssertionError(f"records never arrived: {sorted(wanted)}")


def _wait_failed_attempts(log: Path, request_ids: set[str]) -> None:
    """Until the gateway's log shows a failed attempt to file each record (the tracker is down)."""
    deadline = time.monotonic() + ARRIVE_WITHIN_S
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        failed = {rid for rid in request_ids if f"work record {rid} not filed yet" in text}
        if failed == request_ids:
            return
        assert time.monotonic() < deadline, f"the gateway never tried to replay {sorted(request_ids - failed)}"
        time.sleep(0.05)


def _streams_started(base_url: str, count: int, auth: dict[str, str]) -> tuple[list[SseResult], list[threading.Thread]]:
    """``count`` streams, returned once each has produced text (its route is running)."""
    results: list[SseResult] = []
    started = threading.Semaphore(0)

    def on_item(item: SseItem, items: list[SseItem]) -> None:
        if item.kind == "chunk" and item.text and sum(1 for i in items if i.text) == 1:
            started.release()

    def one() -> None:
        results.append(read_sse(base_url, "/v1/chat/completions", chat_body(MAX_TOKENS), on_item=on_item, headers=auth))

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for _ in range(count):
        assert started.acquire(timeout=30), "a stream never started"
    return results, threads


def _start(swarm: Swarm, gateway_home: Path) -> str:
    swarm.start_tracker()
    swarm.start_workers("0:2", "2:4", "4:6")
    base_url = swarm.start_gateway(data_dir=gateway_home)
    swarm.wait_routable(nodes=3)
    return base_url


def test_sigterm_with_reports_queued_and_the_tracker_down_loses_nothing(tmp_path: Path) -> None:
    with Swarm(tmp_path, write_tiny_model(tmp_path)) as swarm:
        base_url = _start(swarm, home := tmp_path / "gateway-home")
        results, threads = _streams_started(base_url, CLIENTS, swarm.auth)
        assert swarm.tracker is not None
        swarm.tracker.kill(signal.SIGKILL)
        swarm.tracker.process.wait(timeout=5)
        for thread in threads:
            thread.join(timeout=60)
        assert [r.status for r in results] == [200] * CLIENTS and all(r.items[-1].kind == "done" for r in results)
        completed = {r.request_id for r in results}
        queued = {row[0] for row in query_db(home / "gateway" / "outbox.sqlite3", "SELECT request_id FROM outbox")}
        assert queued == completed, "the records were not written ahead"

        gateway = swarm.gateways[0]
        stopping = time.monotonic()
        gateway.kill(signal.SIGTERM)
        code = gateway.process.wait(timeout=15)
        print(f"\ngateway stopped by SIGTERM in {time.monotonic() - stopping:.2f} s, exit code {code}")
        assert code == 0, f"the shutdown path did not run (exit {code}); log:\n{gateway.log_tail()}"

        swarm.start_gateway(data_dir=home)  # replays the outbox; the tracker is still down
        _wait_failed_attempts(swarm.gateways[-1].spec.log_path, completed)
        swarm.start_tracker(port=swarm.tracker_port)
        rows = _wait_records(swarm.db_path, completed)
        counts = Counter(row[0] for row in rows)
        assert all(counts[rid] == 1 for rid in completed)
        assert {row[0]: (row[1], row[2]) for row in rows} == {rid: ("completed", MAX_TOKENS) for rid in completed}


def test_sigkill_mid_request_leaves_a_record_counted_by_the_shards(tmp_path: Path) -> None:
    with Swarm(tmp_path, write_tiny_model(tmp_path)) as swarm:
        base_url = _start(swarm, home := tmp_path / "gateway-home")
        with httpx.stream(
            "POST", base_url + "/v1/chat/completions", json=chat_body(MAX_TOKENS), headers=swarm.auth, timeout=30
        ) as response:
            cut_off = response.headers["x-request-id"]
            lines = response.iter_lines()
            # Generating now: a token's text arrived (the shards have computed, and count, it).
            next(
                line
                for line in lines
                if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line
            )
            swarm.gateways[0].kill(signal.SIGKILL)
            with pytest.raises(httpx.HTTPError):
                for _ in lines:
                    pass
        swarm.start_gateway(data_dir=home)
        rows = _wait_records(swarm.db_path, {cut_off})
        [(request_id, status, tokens_out)] = rows
        assert (request_id, status) == (cut_off, "completed_by_shards") and tokens_out >= 1
