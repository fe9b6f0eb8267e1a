"""The session table of one shard: KV slots, positions, idempotency, eviction and expiry.

Lives on the event loop (one thread), so it needs no lock. Every frame is checked here before
it may touch the KV: a repeated step is answered from the cache (no second append), a gap in
positions or a foreign epoch is refused, and a session that was evicted answers CacheMiss, never
a silent recompute on wrong state.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from meshnet.core.errors import CacheMiss, FailedPrecondition, ResourceExhausted, RouteStale
from meshnet.core.ids import RequestId, SessionId
from meshnet.session.admission import (
    AdmissionPolicy,
    Admit,
    SlotUse,
    decide_admission,
    expired_sessions,
)

MAX_TOMBSTONES = 4096


@dataclass
class Session:
    key: SessionId
    request_id: RequestId
    slot: int
    epoch: int
    last_used: float
    next_position: int = 0
    last_step: int | None = None
    last_result: Any = None
    """The answer to ``last_step``, returned again if that step is repeated."""
    busy: bool = False
    context: dict[str, Any] = field(default_factory=dict)
    """Owned by the server: sampling, downstream stream, and the like."""


StepCheck = Literal["duplicate", "next"]


class SessionTable:
    def __init__(self, policy: AdmissionPolicy, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self._sessions: dict[SessionId, Session] = {}
        # Lowest free slot first: llama.cpp batches only runs of consecutive sequence ids into
        # one graph evaluation, so keeping live slots packed keeps decode batches whole.
        self._free = list(range(policy.max_sessions))
        self._gone: OrderedDict[SessionId, str] = OrderedDict()
        self.evictions = 0
        self.rejections = 0
        self.min_epoch = 0
        """Frames opening a session with an older route epoch are refused (set from the tracker)."""

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, key: object) -> bool:
        return key in self._sessions

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def sessions(self) -> list[Session]:
        return list(self._sessions.values())

    def open(
        self, key: SessionId, request_id: RequestId, epoch: int, queue_depth: int
    ) -> tuple[Session, Session | None]:
        """Admit a new session; returns it and the session evicted to make room (if any)."""
        if key in self._sessions:
            raise FailedPrecondition(f"session {key} already exists on this shard; continue it or release it first")
        if epoch < self.min_epoch:
            raise RouteStale(f"route epoch {epoch} is older than this shard's {self.min_epoch}: refresh the route")
        now = self._clock()
        uses = [SlotUse(s.key, s.last_used, s.busy) for s in self._sessions.values()]
        decision = decide_admission(uses, queue_depth, self.policy, now)
        if not isinstance(decision, Admit):
            self.rejections += 1
            raise ResourceExhausted(f"shard full: {decision.reason}")
        evicted = None
        if decision.evict is not None:
            evicted = self.close(SessionId(decision.evict), reason="evicted to make room (least recently used)")
            self.evictions += 1
        session = Session(key, request_id, heapq.heappop(self._free), epoch, now)
        self._sessions[key] = session
        self._gone.pop(key, None)
        return session, evicted

    def get(self, key: SessionId) -> Session:
        session = self._sessions.get(key)
        if session is None:
            reason = self._gone.get(key, "it is unknown here")
            raise CacheMiss(f"session {key} has no KV on this shard: {reason}")
        return session

    def check_step(self, session: Session, *, step: int, position: int, epoch: int) -> StepCheck:
        if epoch != session.epoch:
            raise RouteStale(f"frame epoch {epoch} does not match the session's route epoch {session.epoch}")
        if session.last_step is not None and step == session.last_step:
            return "duplicate"
        expected_step = 0 if session.last_step is None else session.last_step + 1
        if step != expected_step:
            raise FailedPrecondition(f"step {step} out of order: expected {expected_step}")
        if position != session.next_position:
            raise FailedPrecondition(
                f"position {position} does not continue the session's KV, which ends at {session.next_position}"
            )
        return "next"

    def record(self, session: Session, *, step: int, next_position: int, result: Any) -> None:
        session.last_step = step
        session.next_position = next_position
        session.last_result = result
        session.last_used = self._clock()

    def close(self, key: SessionId, *, reason: str = "released") -> Session | None:
        session = self._sessions.pop(key, None)
        if session is not None:
            heapq.heappush(self._free, session.slot)
            self._gone[key] = reason
            while len(self._gone) > MAX_TOMBSTONES:
                self._gone.popitem(last=False)
        return session

    def expired(self) -> list[SessionId]:
        uses = [SlotUse(s.key, s.last_used, s.busy) for s in self._sessions.values()]
        return [SessionId(k) for k in expired_sessions(uses, self.policy, self._clock())]
