"""Pure admission: may a new session take a KV slot, and whom to evict for it.

A shard rejects fast instead of queueing without bound (RESOURCE_EXHAUSTED, the gateway's 503 +
Retry-After). A session between two decode steps is never pushed out for a newcomer unless it is
stale or its opener holds more than its share.

Peers are bounded (``PeerBounds``) because an admitted certificate is not a trusted one: a worker
certificate could open every slot of a shard and keep each alive with one step every few seconds.

- **Who**: the *opener*, the certificate that sent the session's opening frame (its node id, so
  one certificate is one identity). On the head that is a gateway; on any later shard it is the
  upstream worker, which relays for every user of its routes. A lone honest opener must still be
  able to fill the shard, so the bound is work-conserving: while a slot is free anyone takes it;
  once the shard is full an opener holding ``bound`` sessions or more is refused (naming the
  bound) and never evicts another opener's session, while an opener under its bound may take
  back a slot from one over it (that opener's least recently used session between steps).
- **How long**: a session must make progress. Idleness is measured on steps that make progress
  (a repeated step is answered from the cache and renews nothing), and besides idleness a
  session has a budget of ``grace`` seconds plus one second per ``min_token_rate`` positions it
  has run: a trickle of steps slower than that rate runs out of budget, and since positions end
  at the context size no session outlives ``grace + n_ctx / min_token_rate`` whatever it sends.
  A session out of budget may be evicted for a newcomer like an idle one; it is not expired
  without pressure, so a slow honest session on an otherwise quiet shard is never cut.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SlotUse:
    session_key: str
    last_used: float
    busy: bool
    """A step of this session is queued or running."""
    opener: str | None
    """The certificate (node id) that opened the session; None on an unchecked development worker."""
    opened_at: float
    progress: int
    """Positions the session has run on this shard."""


@dataclass(frozen=True)
class PeerBounds:
    """How much of a shard one opener may hold, and for how long (see the module's docstring)."""

    share: float
    """Share of the shard's sessions an opener may hold once the shard is full (0 < share <= 1)."""
    min_token_rate: float
    """Positions per second a session must average, after ``grace``, to keep its slot under pressure."""
    grace: float
    """Seconds every session may hold its slot whatever its progress."""

    def bound(self, max_sessions: int) -> int:
        return max(1, math.ceil(self.share * max_sessions))


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
    peers: PeerBounds


@dataclass(frozen=True)
class Admit:
    evict: str | None = None
    """Session to evict first, if any."""


@dataclass(frozen=True)
class Reject:
    reason: str


def out_of_budget(use: SlotUse, peers: PeerBounds, now: float) -> bool:
    """The session has held its slot longer than its progress pays for (see the module's docstring)."""
    return now - use.opened_at > peers.grace + use.progress / peers.min_token_rate


def decide_admission(
    uses: Sequence[SlotUse], opener: str | None, queue_depth: int, policy: AdmissionPolicy, now: float
) -> Admit | Reject:
    """Admit a session that ``opener`` opens, evicting whom (if anyone), or refuse it."""
    if queue_depth >= policy.max_queue:
        return Reject(f"queue full ({queue_depth} steps waiting)")
    if len(uses) < policy.max_sessions:
        return Admit()
    peers = policy.peers
    bound = peers.bound(policy.max_sessions)
    held = Counter(u.opener for u in uses)
    stale = [
        u for u in uses if not u.busy and (now - u.last_used >= policy.evict_idle_after or out_of_budget(u, peers, now))
    ]
    if held[opener] >= bound:
        own = [u for u in stale if u.opener == opener]
        if own:
            return Admit(evict=_least_recent(own))
        return Reject(
            f"all {policy.max_sessions} KV slots are taken, {held[opener]} by this peer: at or over its bound "
            f"of {bound} (session share {peers.share:g})"
        )
    if stale:
        return Admit(evict=_least_recent(stale))
    over = [u for u in uses if not u.busy and held[u.opener] > bound]
    if over:
        return Admit(evict=_least_recent(over))
    return Reject(f"all {policy.max_sessions} KV slots hold active sessions")


def _least_recent(uses: Sequence[SlotUse]) -> str:
    return min(uses, key=lambda u: u.last_used).session_key


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
    prefix_cache_bytes: int = 0
    """The reuse store's budget (``session.kv_store``): what the memory budget leaves after the
    sessions, up to ``--prefix-cache-mb``."""
