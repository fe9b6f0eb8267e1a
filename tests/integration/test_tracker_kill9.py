"""K1: kill -9 the tracker process while work records are written, restart it on the same file.

Pass figure (reliability.md): 0 acknowledged records lost, 0 duplicated; serving again within
2 s; workers re-register and routes work again.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from worker_harness import fake_record
from worker_harness import sample_work_record as record

from meshnet.core.errors import DeadlineExceeded, InvalidArgument, Unavailable
from meshnet.core.ids import NodeId, RequestId
from meshnet.core.layers import LayerRange
from meshnet.core.tracking import HeartbeatStatus, NodeLoad, WorkRecord
from meshnet.deploy.launch.commands import tracker_launch
from meshnet.deploy.launch.ready_lines import TrackerLine
from meshnet.membership.tracker_client import TrackerClient
from meshnet.process.launcher import child_environment
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.store import SqliteTrackerStore

pytestmark = pytest.mark.timeout(60)

WRITERS = 4
REGISTRATION = fake_record(LayerRange(0, 6), "127.0.0.1:9101", n_layers=6)


async def start_tracker_process(db: Path, port: int, log: Path) -> tuple[asyncio.subprocess.Process, int]:
    # About durability, not security: plaintext on loopback.
    config = TrackerConfig(port=port, db_path=db, heartbeat_interval_s=0.5, shutdown_grace_s=1.0, insecure=True)
    launch = tracker_launch(config, db.parent)
    process = await asyncio.create_subprocess_exec(
        *launch.argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=log.open("ab"),
        env=child_environment(launch.environment),
    )
    assert process.stdout is not None
    line = (await asyncio.wait_for(process.stdout.readline(), timeout=10)).decode().rstrip("\n")
    try:
        address = TrackerLine.read(line).address
    except InvalidArgument:
        process.kill()
        raise AssertionError(f"tracker did not start: {line!r}; log: {log.read_text()}") from None
    return process, int(address.rsplit(":", 1)[1])


async def serving_again(client: TrackerClient, node_id: NodeId, deadline: float) -> HeartbeatStatus:
    """The first heartbeat the restarted tracker answers, or fail once ``deadline`` passes."""
    while True:
        try:
            return await client.heartbeat(node_id, NodeLoad(free_sessions=4), timeout_s=0.5)
        except (Unavailable, DeadlineExceeded):
            if time.monotonic() > deadline:
                raise AssertionError("the tracker was not serving again within 2 s") from None
            await asyncio.sleep(0.02)


class Writers:
    """Report unique records as fast as acknowledgements come back; retry each until acked."""

    def __init__(self, client: TrackerClient) -> None:
        self.client = client
        self.acked: dict[str, WorkRecord] = {}
        self.acked_as_duplicate: list[str] = []
        self.failures = 0
        self.crossed_the_crash = 0
        """Records first sent before the kill and acknowledged after it."""
        self.killed_at = float("inf")
        self.stop = asyncio.Event()

    async def run(self, writer: int) -> None:
        index, retrying, first_sent_at = 0, False, 0.0
        while not self.stop.is_set():
            sent = record(f"req-{writer}-{index}")
            first_sent_at = first_sent_at if retrying else time.monotonic()
            try:
                ack = await self.client.report_work(sent, timeout_s=0.5)
            except (Unavailable, DeadlineExceeded):
                # Unknown outcome: retry the *same* record; idempotency makes that safe.
                self.failures += 1
                retrying = True
                await asyncio.sleep(0.02)
                continue
            retrying = False
            if first_sent_at < self.killed_at < time.monotonic():
                self.crossed_the_crash += 1
            self.acked[sent.request_id] = sent
            if ack.duplicate:
                self.acked_as_duplicate.append(sent.request_id)
            index += 1

    async def until(self, count: int, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.acked) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(self.acked)} of {count} records acknowledged")
            await asyncio.sleep(0.01)


async def test_kill_9_mid_write_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    db, log = tmp_path / "tracker.sqlite3", tmp_path / "tracker.log"
    first, port = await start_tracker_process(db, 0, log)
    processes = [first]
    try:
        async with TrackerClient(f"127.0.0.1:{port}", timeout_s=2.0) as client:
            registered = await client.register(REGISTRATION, NodeId("w-kill9"))
            writers = Writers(client)
            tasks = [asyncio.create_task(writers.run(index)) for index in range(WRITERS)]
            await writers.until(60)

            writers.killed_at = time.monotonic()
            first.send_signal(signal.SIGKILL)  # mid-write: the writers always have reports in flight
            await first.wait()
            acked_before_restart = len(writers.acked)
            restarted_at = time.monotonic()
            second, _ = await start_tracker_process(db, port, log)
            processes.append(second)
            heartbeat = await serving_again(client, registered.node_id, restarted_at + 2.0)

            await writers.until(acked_before_restart + 60)
            writers.stop.set()
            await asyncio.gather(*tasks)

            # The restarted tracker forgot the node; it rejoins under the same id, newer epoch.
            assert not heartbeat.known and heartbeat.epoch > registered.epoch
            again = await client.register(REGISTRATION, registered.node_id)
            assert again.node_id == registered.node_id and again.epoch > registered.epoch
            route = await client.choose_route("tiny")
            assert route.node_ids == (registered.node_id,)

            # Reporting acknowledged records again stores nothing new.
            for request_id in list(writers.acked)[:: max(1, len(writers.acked) // 20)]:
                assert (await client.report_work(writers.acked[request_id])).duplicate

        second.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(second.wait(), timeout=10) == 0
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
                await process.wait()

    # Only a report cut off by the kill may have been committed before its reply was lost.
    assert len(writers.acked_as_duplicate) <= WRITERS
    # Reports cut off by the kill were retried (by gRPC's retry policy or by the writer) and
    # acknowledged by the restarted tracker: the crash really happened mid-write.
    assert writers.crossed_the_crash >= 1
    stored = SqliteTrackerStore(db).list_work()
    stored_ids = [item.request_id for item in stored]
    assert len(stored_ids) == len(set(stored_ids)), "a record was stored twice"
    by_id = {item.request_id: item for item in stored}
    lost = [request_id for request_id in writers.acked if by_id.get(RequestId(request_id)) is None]
    assert lost == [], f"acknowledged records lost: {lost[:5]}"
    assert all(by_id[RequestId(rid)] == sent for rid, sent in writers.acked.items())
    # Unacknowledged extras are at most the reports in flight at the kill.
    assert len(stored) - len(writers.acked) <= WRITERS
    shares = sqlite3.connect(db).execute("SELECT count(*) FROM work_shares").fetchone()[0]
    assert shares == 2 * len(stored)
