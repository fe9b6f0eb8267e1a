"""Pure admission: may a new session take a KV slot, and whom to evict for it.

A shard rejects fast instead of queueing without bound (RESOURCE_EXHAUSTED, the gateway's 503 +
Retry-After). Only sessions idle longer than ``evict_idle_after`` may be evicted for a newcomer,
least recently used first: a session between two decode steps is never pushed out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SlotUse:
    session_key: str
    last_used: float
    busy: bool
    """A step of this session is queued or running."""


@dataclass(frozen=True)
class AdmissionPolicy:
    """Built from the worker's config (``WorkerConfig.admission_policy``), so no defaults here."""

    max_sessions: int
    """Sessions that may hold KV at once (the capacity plan's count)."""
    max_queue: int
    """Queued steps across all sessions beyond which new sessions are refused."""
    evict_idle_after: float
    """Seconds without a step after which a session may be evicted for a newcomer."""
    ttl: float
    """Seconds without a step after which a session is expired even without pressure."""


@dataclass(frozen=True)
class Admit:
    evict: str | None = None
    """Session to evict first, if any."""


@dataclass(frozen=True)
class Reject:
    reason: str


def decide_admission(uses: Sequence[SlotUse], queue_depth: int, policy: AdmissionPolicy, now: float) -> Admit | Reject:
    if queue_depth >= policy.max_queue:
        return Reject(f"queue full ({queue_depth} steps waiting)")
    if len(uses) < policy.max_sessions:
        return Admit()
    idle = [u for u in uses if not u.busy and now - u.last_used >= policy.evict_idle_after]
    if not idle:
        return Reject(f"all {policy.max_sessions} KV slots hold active sessions")
    return Admit(evict=min(idle, key=lambda u: u.last_used).session_key)


def expired_sessions(uses: Sequence[SlotUse], policy: AdmissionPolicy, now: float) -> list[str]:
    return [u.session_key for u in uses if not u.busy and now - u.last_used >= policy.ttl]


@dataclass(frozen=True)
class CapacityPlan:
    """How many sessions a shard holds within its memory budget, and what it holds for them
    (figures of the memory cost model, ``core.layer_costs``; ``node.assembly`` plans it)."""

    max_sessions: int
    weight_bytes: int
    kv_bytes_per_session: int
    other_bytes: int
    """Everything else at ``max_sessions``: runtime, scratch, a head's table, a tail's LM head
    and vocabulary."""
    budget_bytes: int | None
