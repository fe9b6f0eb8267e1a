"""Seeder processes and an in-process tracker for the artifact-plane tests."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

from meshnet.process.launcher import ChildProcess, LaunchSpec, meshnet_command, stop_all
from meshnet.tracker.server import RunningTracker, TrackerConfig, start_tracker

SEED_READY = "meshnet seed ready "


@asynccontextmanager
async def running_tracker(folder: Path) -> AsyncIterator[RunningTracker]:
    tracker = await start_tracker(TrackerConfig(port=0, db_path=folder / "tracker.sqlite3", heartbeat_interval_s=0.5))
    try:
        yield tracker
    finally:
        await tracker.stop(0.5)


@contextmanager
def seeders(folder: Path, tracker: str, *directories: Path, timeout_s: float = 30.0) -> Iterator[list[ChildProcess]]:
    """One ``meshnet seed`` process per directory, each announced to ``tracker``."""
    children = []
    try:
        for index, directory in enumerate(directories):
            command = meshnet_command(folder / f"seed-{index}", "seed", str(directory), "--tracker", tracker)
            children.append(
                ChildProcess(LaunchSpec(f"seed-{index}", command, folder / f"seed-{index}.log", SEED_READY))
            )
        deadline = time.monotonic() + timeout_s
        for child in children:
            child.await_ready(deadline)
        yield children
    finally:
        stop_all(children)


async def wait_for_holders(tracker: str, model_id: str, count: int, timeout_s: float = 20.0) -> None:
    """Until ``count`` holders announced ``model_id``'s manifest (announcements are asynchronous)."""
    import asyncio

    from meshnet.client.artifact_client import find_holders

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = await find_holders(tracker, model_id)
        if len(found.holders) >= count:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{count} holders of {model_id} never announced themselves")
