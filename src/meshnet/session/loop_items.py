"""What the engine loop's inbox carries (work, truncations, calls), its counters, and how a
result goes back to the event loop that waits for it; the loop itself is ``engine_loop``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from meshnet.engine.backend import Backend, StepInput, StepOutput


@dataclass
class Work:
    ticket: int
    step: StepInput
    deadline: float | None
    enqueued_at: float
    future: asyncio.Future[StepOutput]
    pieces: list[StepInput]
    """The step cut into prefill chunks (one piece for a decode step); one runs per tick."""
    outputs: list[StepOutput] = field(default_factory=list)
    """One per piece run so far."""
    export_at: int | None = None
    """Export the slot's KV once its pieces have run up to this position (a piece boundary)."""
    exported: bytes | None = None
    arrived: float = field(default_factory=time.monotonic)
    """Real time of arrival (the gather window is real time whatever ``clock`` the loop has)."""

    @property
    def next_piece(self) -> StepInput:
        return self.pieces[len(self.outputs)]


@dataclass
class Truncate:
    slot: int
    position: int
    future: asyncio.Future[None]


@dataclass
class Call:
    function: Callable[[Backend], Any]
    future: asyncio.Future[Any]


@dataclass
class LoopStats:
    """Counters read by metrics; written only by the loop thread (ints are atomic enough)."""

    decode_steps: int = 0
    decode_batches: int = 0
    prefill_tokens: int = 0
    busy_seconds: float = 0.0
    expired: int = 0
    queue_depth: int = 0


Settled = tuple[asyncio.Future[Any], Any, BaseException | None]
"""A future the loop thread finished, with its value or its error."""


def resolve_all(settled: list[Settled]) -> None:
    """Hand the futures of one tick back to their event loops: one callback per loop, so every
    session of the batch wakes in the same turn of its loop (and their frames to the next hop
    leave in one ring batch, ``route.coalescer``). One callback per future let the event loop
    wake between them (each wake-up write releases the GIL) and split the batch over turns."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Settled]] = {}
    for item in settled:
        by_loop.setdefault(item[0].get_loop(), []).append(item)
    for loop, items in by_loop.items():
        # A closed event loop means the process is shutting down: nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle_all, items)


def _settle_all(items: list[Settled]) -> None:
    for future, value, error in items:
        if future.done():
            continue  # the awaiting task was cancelled; nobody wants the result
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)
