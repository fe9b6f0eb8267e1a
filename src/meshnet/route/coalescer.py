"""Rows queued by many sessions leave as one message: the ring's batching, without its transport.

The engine thread settles the futures of one decode batch together, so the sessions of one engine
step all reach their send in the same turn of the event loop. A writer that runs only after
them (and one extra turn, for a session that still had one await to pass) finds every row of
the step queued and writes them as one message. No timer: a row never waits for rows that are
not already on their way, so a lone session pays one loop turn, not a delay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

WriteRows = Callable[[Sequence[T]], Awaitable[None]]
"""Sends the queued rows as one message; raises why it could not."""


@dataclass
class SeamCount:
    """What a worker sent across its seams: gRPC messages, and the session rows they carried.

    Mutable on purpose: one per worker, added to by every sender of the worker (a session's own
    stream counts one message of one row, a batch one message of many rows)."""

    messages: int = 0
    rows: int = 0

    def add(self, rows: int) -> None:
        self.messages += 1
        self.rows += rows


class Coalescer(Generic[T]):
    """Queues rows and writes everything queued as one message whenever its writer gets to run.

    ``send`` returns once the message holding the row is written (or raises why it was not): the
    sender keeps the backpressure of a plain stream write, and rows of one sender stay in order."""

    def __init__(self, write: WriteRows[T], max_rows: int) -> None:
        self._write = write
        self._max_rows = max_rows
        """Rows per message at most; more queued at once leave in several messages."""
        self._queued: list[tuple[T, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def send(self, row: T) -> None:
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queued.append((row, written))
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._drain())
        await written

    async def _drain(self) -> None:
        try:
            # One more turn: a session of the same engine step one await behind the first queues now.
            await asyncio.sleep(0)
            while self._queued:
                batch, self._queued = self._queued[: self._max_rows], self._queued[self._max_rows :]
                await self._write_batch(batch)
        finally:
            self._writer = None
            queued, self._queued = self._queued, []
            for _, written in queued:  # only when cancelled with rows still queued (shutdown)
                written.cancel()

    async def _write_batch(self, batch: list[tuple[T, asyncio.Future[None]]]) -> None:
        try:
            await self._write([row for row, _ in batch])
        except Exception as error:
            for _, written in batch:
                if not written.done():
                    written.set_exception(error)
            return
        except asyncio.CancelledError:
            for _, written in batch:
                if not written.done():
                    written.cancel()
            raise
        for _, written in batch:
            if not written.done():
                written.set_result(None)
