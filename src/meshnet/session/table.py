"""The session table of one shard: KV slots, positions, idempotency, eviction and expiry.

Lives on the event loop (one thread), so it needs no lock. Every frame is checked here before
it may touch the KV: a repeated step is answered from the cache (no second append), a gap in
positions or a foreign epoch is refused, and a session that was evicted answers CacheMiss, never
a silent recompute on wrong state.

The table is generic in what its owner keeps per session (``S``: the worker's sampling
parameters or downstream link), fixed when the session opens; the table itself only keeps the
bookkeeping every frame is checked against.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from meshnet.core.errors import CacheMiss, FailedPrecondition, ResourceExhausted, RouteStale
from meshnet.core.ids import SessionId
from meshnet.session.admission import (
    AdmissionPolicy,
    Admit,
    SlotUse,
    decide_admission,
    expired_sessions,
)
from meshnet.wire.frames import StepResult

MAX_TOMBSTONES = 4096
S = TypeVar("S")


@dataclass(frozen=True)
class Answered:
    """The last step a session ran and its answer, returned again if that step is repeated."""

    step: int
    result: StepResult


@dataclass
class Session(Generic[S]):
    key: SessionId
    slot: int
    epoch: int
    state: S
    """What the owner fixed for this session when it opened; never replaced."""
    last_used: float
    opener: str | None
    """The certificate that opened it (``admission``: peers are bounded by it)."""
    opened_at: float
    next_position: int = 0
    answered: Answered | None = None
    busy: bool = False
    """A step of this session is queued or running: it must not be evicted or expired."""

    def use(self) -> SlotUse:
        return SlotUse(self.key, self.last_used, self.busy, self.opener, self.opened_at, self.next_position)


class SessionTable(Generic[S]):
    def __init__(self, policy: AdmissionPolicy, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self._sessions: dict[SessionId, Session[S]] = {}
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

    def sessions(self) -> list[Session[S]]:
        return list(self._sessions.values())

    def open(
        self, key: SessionId, epoch: int, queue_depth: int, state: Callable[[], S], *, opener: str | None = None
    ) -> tuple[Session[S], Session[S] | None]:
        """Admit a new session that ``opener`` opens; returns it and the session evicted to make
        room (if any).

        ``state`` is called only once the session is admitted (it may open a connection), and
        before anything is evicted, so a failing ``state`` leaves the table as it was.
        """
        if key in self._sessions:
            raise FailedPrecondition(f"session {key} already exists on this shard; continue it or release it first")
        if epoch < self.min_epoch:
            raise RouteStale(f"route epoch {epoch} is older than this shard's {self.min_epoch}: refresh the route")
        now = self._clock()
        uses = [s.use() for s in self._sessions.values()]
        decision = decide_admission(uses, opener, queue_depth, self.policy, now)
        if not isinstance(decision, Admit):
            self.rejections += 1
            raise ResourceExhausted(f"shard full: {decision.reason}")
        owned = state()
        evicted = None
        if decision.evict is not None:
            evicted = self.close(
                SessionId(decision.evict), reason="evicted to make room (idle, out of budget or over its peer's share)"
            )
            self.evictions += 1
        session = Session(key, heapq.heappop(self._free), epoch, owned, now, opener, now)
        self._sessions[key] = session
        self._gone.pop(key, None)
        return session, evicted

    def find(self, key: SessionId) -> Session[S] | None:
        """The session if it is held here (``get`` raises ``CacheMiss`` instead)."""
        return self._sessions.get(key)

    def get(self, key: SessionId) -> Session[S]:
        session = self._sessions.get(key)
        if session is None:
            reason = self._gone.get(key, "it is unknown here")
            raise CacheMiss(f"session {key} has no KV on this shard: {reason}")
        return session

    def check_step(self, session: Session[S], *, step: int, position: int, epoch: int) -> StepResult | None:
        """The cached answer when ``step`` repeats the last one; None when it is the next step.

        Anything else (a foreign epoch, a skipped step, a position gap) is refused.
        """
        if epoch != session.epoch:
            raise RouteStale(f"frame epoch {epoch} does not match the session's route epoch {session.epoch}")
        answered = session.answered
        if answered is not None and step == answered.step:
            return answered.result
        expected_step = 0 if answered is None else answered.step + 1
        if step != expected_step:
            raise FailedPrecondition(f"step {step} out of order: expected {expected_step}")
        if position != session.next_position:
            raise FailedPrecondition(
                f"position {position} does not continue the session's KV, which ends at {session.next_position}"
            )
        return None

    def start_at(self, session: Session[S], position: int) -> None:
        """A session just opened holds KV up to ``position`` already (restored, not computed)."""
        if session.answered is not None:
            raise FailedPrecondition(f"session {session.key} has run steps: its KV cannot be replaced")
        session.next_position = position

    def record(self, session: Session[S], *, step: int, next_position: int, result: StepResult) -> None:
        """``step`` ran: the session's KV now ends at ``next_position`` (this shard's own count, not
        the downstream answer's), and ``result`` is what a repeat of ``step`` gets."""
        session.answered = Answered(step, result)
        session.next_position = next_position
        session.last_used = self._clock()

    def close(self, key: SessionId, *, reason: str = "released") -> Session[S] | None:
        session = self._sessions.pop(key, None)
        if session is not None:
            heapq.heappush(self._free, session.slot)
            self._gone[key] = reason
            while len(self._gone) > MAX_TOMBSTONES:
                self._gone.popitem(last=False)
        return session

    def expired(self) -> list[SessionId]:
        uses = [s.use() for s in self._sessions.values()]
        return [SessionId(k) for k in expired_sessions(uses, self.policy, self._clock())]
