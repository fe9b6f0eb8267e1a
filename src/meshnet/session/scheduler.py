"""Pure scheduling: which pending work the engine runs in its next tick.

Policy, and why:
- every ready one-token decode step runs in the tick, batched into one llama.cpp call
  (batched decode is bit-identical to solo decode and raises aggregate throughput);
- at most one prefill chunk runs per tick, oldest first, so a long prompt never holds the
  decode steps of other sessions for more than one chunk, and decode never starves prefill
  (a waiting chunk runs in every tick);
- work past its deadline is failed before it runs, so it never appends KV.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PendingWork:
    ticket: int
    n_tokens: int
    """Tokens of the next chunk this work would run (1 for a decode step)."""
    enqueued_at: float
    deadline: float | None


@dataclass(frozen=True)
class TickPlan:
    run: tuple[int, ...]
    """Tickets to run now: decode steps first, then at most one prefill chunk."""
    expired: tuple[int, ...]


def plan_tick(pending: Sequence[PendingWork], *, now: float, max_decode_batch: int) -> TickPlan:
    expired = tuple(w.ticket for w in pending if w.deadline is not None and w.deadline <= now)
    live = [w for w in pending if w.ticket not in expired]
    live.sort(key=lambda w: (w.enqueued_at, w.ticket))
    decode = [w.ticket for w in live if w.n_tokens == 1][:max_decode_batch]
    prefill = [w.ticket for w in live if w.n_tokens > 1][:1]
    return TickPlan(tuple(decode + prefill), expired)
