"""Records that survive the tracker's disk (issue 29, finding 8), on a real swarm over mTLS.

- Disk full: the tracker's database lives on a tmpfs of a few MB, mounted for the test; once the
  swarm serves, a filler file takes every free byte for 30 s while 20 requests are served. The
  tracker must answer each report "retry" (UNAVAILABLE, storage_unavailable), the gateway keep
  every record in its outbox (its depth on /metrics), and all 20 be stored exactly once after
  the filler is removed. Before: UNKNOWN, taken for a refusal, 6 of 6 records deleted.
- Emptied database: the tracker is killed and restarted over an empty file (its epoch file gone
  too) while the workers hold a high epoch; the swarm must serve again within 5 s of the
  tracker's ready line. Before: epoch 1 against the workers' 127, route_stale with no recovery.
- Damaged database: a file that fails ``PRAGMA integrity_check`` is refused at start with a
  message naming it, and left exactly as it was. Before: served and written to.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from swarm_harness import Swarm, chat_body, query_db, write_tiny_model

from meshnet.deploy.launch.commands import tracker_launch
from meshnet.process.launcher import child_environment
from meshnet.tracker.config import TrackerConfig

pytestmark = pytest.mark.timeout(180)

REQUESTS = 20
FULL_FOR_S = 30.0
"""How long the tracker's disk stays full (issue 29's acceptance): a duration the scenario is made of."""
MAX_TOKENS = 8
STORED_WITHIN_S = 30.0
"""Once space returns: the outbox's backoff tops out at 5 s, so this is generous."""
SERVING_WITHIN_S = 5.0
HIGH_EPOCH = 127
"""The epoch the workers held in the finding's probe."""
DISK_SIZE = "4m"
REFUSED_WITHIN_S = 20.0
"""A tracker refusing its database exits at once (about 2 s of Python start-up); one still running
then is serving it."""


@pytest.fixture
def tracker_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of a few MB for the tracker's data alone; unmounted whatever happens."""
    folder = tmp_path / "tracker-disk"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE},mode=0700", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for the tracker's disk (needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _fill(folder: Path) -> Path:
    """Take every free byte of ``folder``'s filesystem with one file; returns it."""
    filler = folder / "filler"
    chunk = b"\0" * 65536
    with filler.open("wb", buffering=0) as out:
        for size in (65536, 4096, 512, 1):
            try:
                while True:
                    out.write(chunk[:size])
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
    return filler


def _gateway_figures(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url + "/metrics", timeout=5).text
    prefix = "meshnet_gateway_"
    return {
        name.removeprefix(prefix): float(value)
        for name, value in (line.split() for line in text.splitlines() if line.startswith(prefix + "outbox_"))
    }


def _stored(db: Path) -> Counter[str]:
    with contextlib.suppress(sqlite3.Error):
        return Counter(row[0] for row in query_db(db, "SELECT request_id FROM work_records WHERE status = 'completed'"))
    return Counter()


def test_a_full_tracker_disk_for_30_s_loses_none_of_20_records(tmp_path: Path, tracker_disk: Path) -> None:
    with Swarm(tmp_path, write_tiny_model(tmp_path), tracker_db=tracker_disk / "tracker.sqlite3") as swarm:
        swarm.start_tracker()
        swarm.start_workers("0:3", "3:6")
        base_url = swarm.start_gateway()
        swarm.wait_routable(nodes=2)
        filler = _fill(tracker_disk)
        full_since = time.monotonic()
        served: list[str] = []
        with httpx.Client(timeout=30, headers=swarm.auth) as client:
            for index in range(REQUESTS):
                # Spread over the outage: request i starts at i/20 of it.
                time.sleep(max(full_since + index * FULL_FOR_S / REQUESTS - time.monotonic(), 0.0))
                response = client.post(base_url + "/v1/chat/completions", json=chat_body(MAX_TOKENS, stream=False))
                assert response.status_code == 200, response.text
                served.append(response.headers["x-request-id"])
        time.sleep(max(full_since + FULL_FOR_S - time.monotonic(), 0.0))
        during = _gateway_figures(base_url)
        stored_during = _stored(swarm.db_path)
        log = swarm.gateways[0].spec.log_path.read_text(errors="replace")
        filler.unlink()
        freed = time.monotonic()
        while set(served) - set(stored := _stored(swarm.db_path)) and time.monotonic() < freed + STORED_WITHIN_S:
            time.sleep(0.2)
        after = _gateway_figures(base_url)
        print(
            f"\n{REQUESTS} requests during {FULL_FOR_S:.0f} s of full disk; stored then: {len(stored_during)}; "
            f"outbox during: {during}; {len(set(served) & set(stored))}/{REQUESTS} stored "
            f"{time.monotonic() - freed:.1f} s after space returned; outbox after: {after}"
        )
        assert "[storage_unavailable]" in log, "the tracker did not say its disk failed"
        assert not set(served) & set(stored_during), "a record was stored on a full disk"
        assert during["outbox_records"] == REQUESTS and during["outbox_oldest_seconds"] > 0
        assert {rid: stored[rid] for rid in served} == dict.fromkeys(served, 1), "records lost or stored twice"
        assert after["outbox_records"] == 0 and after["outbox_refused_records"] == 0


def _raise_epoch(db: Path, epoch: int) -> None:
    with contextlib.closing(sqlite3.connect(db)) as connection, connection:
        connection.execute("UPDATE meta SET value = ? WHERE key = 'epoch'", (epoch,))


def _first_success_after(base_url: str, auth: dict[str, str], since: float, within_s: float) -> tuple[float, int]:
    """Seconds from ``since`` to the first 200, and how many requests failed before it."""
    failed = 0
    with httpx.Client(timeout=10, headers=auth) as client:
        while time.monotonic() < since + within_s:
            response = client.post(base_url + "/v1/chat/completions", json=chat_body(MAX_TOKENS, stream=False))
            if response.status_code == 200:
                return time.monotonic() - since, failed
            failed += 1
            time.sleep(0.05)
    raise AssertionError(f"not serving {within_s:.0f} s after the restart: {failed} requests failed")


def test_a_tracker_restarted_over_an_empty_database_serves_again_within_5_s(tmp_path: Path) -> None:
    with Swarm(tmp_path, write_tiny_model(tmp_path)) as swarm:
        swarm.start_tracker()
        assert swarm.tracker is not None
        swarm.tracker.stop()
        _raise_epoch(swarm.db_path, HIGH_EPOCH)  # as after a long life of membership changes
        swarm.start_tracker(port=swarm.tracker_port)
        swarm.start_workers("0:3", "3:6")
        base_url = swarm.start_gateway()
        swarm.wait_routable(nodes=2)
        _first_success_after(base_url, swarm.auth, time.monotonic(), 10.0)  # serving, workers above 127

        swarm.tracker.kill(signal.SIGKILL)
        swarm.tracker.process.wait(timeout=5)
        for lost in swarm.db_path.parent.glob(swarm.db_path.name + "*"):
            lost.unlink()  # the database, its WAL and the epoch file beside it: all gone
        swarm.db_path.touch()  # an empty file where the database was
        swarm.start_tracker(port=swarm.tracker_port)
        ready = time.monotonic()
        took, failed = _first_success_after(base_url, swarm.auth, ready, 30.0)
        print(f"\nserving again {took:.2f} s after the tracker restarted over an empty database ({failed} failed)")
        assert took <= SERVING_WITHIN_S
        [(epoch,)] = query_db(swarm.db_path, "SELECT value FROM meta WHERE key = 'epoch'")
        assert int(epoch) > HIGH_EPOCH


def _damage(db: Path) -> bytes:
    """A database with records in it whose last page is overwritten: SQLite opens it, and only
    an integrity check finds the damage. Returns the damaged file's bytes."""
    with contextlib.closing(sqlite3.connect(db)) as connection, connection:
        connection.execute("CREATE TABLE IF NOT EXISTS padding (n INTEGER PRIMARY KEY, text TEXT)")
        connection.executemany("INSERT INTO padding(text) VALUES (?)", [("x" * 200,) for _ in range(2000)])
        connection.execute("CREATE INDEX IF NOT EXISTS padding_text ON padding(text)")
    with contextlib.closing(sqlite3.connect(db)) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        connection.execute("PRAGMA journal_mode=DELETE")
    data = bytearray(db.read_bytes())
    page = 4096
    middle = (len(data) // page // 2) * page
    data[middle + 8 : middle + page] = os.urandom(page - 8)
    db.write_bytes(bytes(data))
    return bytes(data)


def test_a_damaged_database_is_refused_at_start_and_left_as_it_was(tmp_path: Path) -> None:
    with Swarm(tmp_path, write_tiny_model(tmp_path)) as swarm:
        swarm.start_tracker()
        assert swarm.tracker is not None
        swarm.tracker.stop()
        damaged = _damage(swarm.db_path)
        config = TrackerConfig(port=0, db_path=swarm.db_path, join_port=0)
        started = time.monotonic()
        launch = tracker_launch(config, swarm.root)
        environment = child_environment(launch.environment)
        with subprocess.Popen(
            launch.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
        ) as tracker:
            try:
                out, err = tracker.communicate(timeout=REFUSED_WITHIN_S)
            except subprocess.TimeoutExpired:
                tracker.kill()
                out, err = tracker.communicate()
                pytest.fail(f"the tracker served a damaged database:\n{out}{err[-2000:]}")
        print(f"\ntracker refused the damaged database in {time.monotonic() - started:.2f} s: {err[-400:]}")
        assert tracker.returncode == 2, out + err
        assert "[storage_damaged]" in err and str(swarm.db_path) in err and "Restore" in err
        assert swarm.db_path.read_bytes() == damaged, "the damaged database was written to"
        assert not Path(f"{swarm.db_path}-wal").exists() or Path(f"{swarm.db_path}-wal").stat().st_size == 0
