"""Pure admission: may a new session take a KV slot, and whom to evict for it.

A shard rejects fast instead of queueing without bound (RESOURCE_EXHAUSTED, the gateway's 503 +
Retry-After). Only sessions idle longer than ``evict_idle_after`` may be evicted for a newcomer,
least recently used first: a session between two decode steps is never pushed out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from meshnet.core.errors import ResourceExhausted


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
    """How many sessions a shard can hold within its memory budget, and why."""

    max_sessions: int
    weight_bytes: int
    kv_bytes_per_session: int
    scratch_bytes: int
    budget_bytes: int | None


def kv_bytes_per_session(
    n_ctx: int, n_layers: int, n_embd: int, n_head: int, n_head_kv: int, bytes_per_value: int = 2
) -> int:
    """K and V for every owned layer and position: [n_ctx, n_embd * n_head_kv / n_head] each, f16."""
    n_embd_kv = n_embd * n_head_kv // max(n_head, 1)
    return 2 * n_ctx * n_layers * n_embd_kv * bytes_per_value


def plan_capacity(
    *, requested_sessions: int, weight_bytes: int, kv_per_session: int, scratch_bytes: int, budget_bytes: int | None
) -> CapacityPlan:
    """Sessions = the requested number, cut to what the budget leaves after weights and scratch.

    Refuses (ResourceExhausted) when not even one session fits: a shard that cannot hold a
    session must not register as if it could.
    """
    sessions = requested_sessions
    if budget_bytes is not None:
        room = budget_bytes - weight_bytes - scratch_bytes
        sessions = min(sessions, room // kv_per_session if kv_per_session > 0 else sessions)
        if sessions < 1:
            raise ResourceExhausted(
                f"memory budget {budget_bytes / 2**20:.0f} MiB cannot hold the weights "
                f"({weight_bytes / 2**20:.0f} MiB), scratch ({scratch_bytes / 2**20:.0f} MiB) "
                f"and one session's KV ({kv_per_session / 2**20:.1f} MiB)"
            )
    return CapacityPlan(sessions, weight_bytes, kv_per_session, scratch_bytes, budget_bytes)
