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


def resolve(future: asyncio.Future[Any], *, value: Any = None, error: BaseException | None = None) -> None:
    def settle() -> None:
        if future.done():
            return  # the awaiting task was cancelled; nobody wants the result
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    # A closed event loop means the process is shutting down: nobody is waiting any more.
    with contextlib.suppress(RuntimeError):
        future.get_loop().call_soon_threadsafe(settle)
