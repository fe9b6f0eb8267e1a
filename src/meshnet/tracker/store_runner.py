"""The tracker's one road to its store: blocking calls on one thread, in order (``StoreRunner``),
and the route epoch made durable before any reply carries it (``DurableEpoch``).

The servicer decides what to store; this module owns how a write reaches the store and what a
failed epoch write leaves behind (the next reply writes it again).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from meshnet.core.errors import StorageUnavailable
from meshnet.tracker.liveness import Hearing
from meshnet.tracker.store import TrackerStore

Result = TypeVar("Result")

STORE_BEHIND_CALLS = 16
"""More store calls than this waiting on the one store thread: the store is behind (strain)."""


class StoreRunner:
    """Runs blocking store calls on one dedicated thread, in the order they were submitted.

    One thread keeps the event loop free while SQLite fsyncs, and keeps the order of epoch
    writes equal to the order the registry produced them.
    """

    def __init__(self, store: TrackerStore, hearing: Hearing | None = None) -> None:
        self.store = store
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracker-store")
        self._hearing = hearing
        """Told while the queue is behind: handlers waiting on it are slow to answer heartbeats."""
        self._queued = 0

    async def call(self, function: Callable[..., Result], *args: Any) -> Result:
        loop = asyncio.get_running_loop()
        self._queue_changed(+1)
        try:
            return await loop.run_in_executor(self._executor, functools.partial(function, *args))
        finally:
            self._queue_changed(-1)

    def _queue_changed(self, by: int) -> None:
        self._queued += by
        if self._hearing is not None:
            self._hearing.strain("store", self._queued > STORE_BEHIND_CALLS)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.store.close()


class DurableEpoch:
    """Writes the registry's epoch through ``runner`` and lets replies wait until it is durable.

    ``current`` reads the registry's epoch; ``saved`` is the epoch already written when this
    starts (a restored registry's epoch is stored before it serves)."""

    def __init__(self, runner: StoreRunner, current: Callable[[], int], saved: int) -> None:
        self._runner = runner
        self._current = current
        self._saved = saved
        self._write: asyncio.Future[None] | None = None

    async def persist(self) -> None:
        """Make the current epoch durable before any reply that carries it goes out."""
        epoch = self._current()
        if epoch > self._saved:
            self._saved = epoch
            self._write = asyncio.ensure_future(self._save(epoch))
        if self._write is not None:
            # The latest write covers every smaller epoch (writes run in order); shield it so a
            # cancelled caller does not cancel a write another reply is waiting for.
            await asyncio.shield(self._write)

    async def _save(self, epoch: int) -> None:
        try:
            await self._runner.call(self._runner.store.save_epoch, epoch)
        except StorageUnavailable:
            # Not durable (a full disk): the next reply writes it again, rather than every reply
            # failing on this one write for ever once the disk is back.
            if self._saved == epoch:
                self._saved = epoch - 1
            raise

    def forget_failed_write(self) -> None:
        """A write failed (any error): the next ``persist`` writes the current epoch again, and
        no reply waits on the failed write any more."""
        self._saved = min(self._saved, self._current() - 1)
        self._write = None
