"""Which of a swarm's tracker replicas a client asks, when it moves, and which calls it asks twice.

A client is given its trackers as a list (``--tracker a:7070,b:7070,c:7070``) and asks them in
an order of its own (``replica_order``): rendezvous hashing of its identity (a worker's node id,
another client's certificate name or a random draw) ranks the replicas, so the clients of a swarm
start spread evenly over them instead of all on the first listed, and when one replica dies its
clients move on spread over the others (each to its own second choice), not all onto the next
listed. Rendezvous rather than "hash modulo count" because a replica removed from the list moves
only its own clients: every other client's first choice keeps the highest score. It sticks
to the replica that answers: moving on a whim would spread one node's calls over every replica
for nothing. Only a failure that shows the replica is gone moves it to the next one in the list,
wrapping around: the library's own UNAVAILABLE or CANCELLED (refused, reset,
GOAWAY, the server stopping), or a replica that answers ``StorageUnavailable`` (cut off from its
store: nothing was stored). A slow replica is not gone: a deadline moves the client only after
``SLOW_STRIKES`` deadlines in a row on that replica, and a call that missed its deadline is never
resent at once (the replica may still be doing it, and resending doubles the load of a swarm
whose trackers are all slow).

A call lost with its replica may have reached it or not; asking again on the next replica is
safe only where a second delivery changes nothing, ``RETRIED_ON_NEXT_REPLICA`` says for which
calls and why. Those retries draw on a ``RetryBudget`` so a swarm-wide outage never doubles the
calls of every client. The others are not repeated by the client: their caller's own loop asks
again (the next renewal) or drops them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import grpc

from meshnet.core.addresses import parse_address_list
from meshnet.core.errors import InvalidArgument, MeshnetError, StorageUnavailable

SLOW_STRIKES = 3
"""Deadlines in a row on one replica that move the client on: one is a slow moment, three at a
heartbeat's pace (a few seconds) is a replica that no longer keeps up."""


class Failure(Enum):
    """What a failed call says about the replica that was asked."""

    GONE = "gone"
    """It cannot be reached, was stopped, or has no store: move now; a safe call is resent."""
    SLOW = "slow"
    """The call ran out of time: a strike against the replica; never resent at once."""
    ANSWERED = "answered"
    """The replica answered (even with an error such as ``NoRoute`` or ``TrackerBusy``): stay."""


def classify(status: grpc.StatusCode | None, error_code: str | None, error: MeshnetError) -> Failure:
    """Judge a replica by how its call ended: ``status`` and ``error_code`` (the peer's
    ``meshnet-error-code`` metadata, None without it) as received, ``error`` as rebuilt.

    Metadata means a tracker answered: only its ``StorageUnavailable`` says it cannot serve. A
    status without it is the library's: UNAVAILABLE or CANCELLED (the replica refused, reset or
    stopped) is gone, DEADLINE_EXCEEDED slow; the error's type alone would mistake a replica
    that answers DeadlineExceeded itself for a slow one."""
    if isinstance(error, StorageUnavailable):
        return Failure.GONE
    if error_code is not None:
        return Failure.ANSWERED
    if status in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return Failure.GONE
    if status == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Failure.SLOW
    return Failure.ANSWERED


RETRIED_ON_NEXT_REPLICA: dict[str, str] = {
    "Register": "an upsert keyed by the node's id: a second one leaves the same record",
    "Heartbeat": "refreshes the node's liveness and load; twice is as once",
    "Deregister": "removing a node twice removes it once",
    "SuggestLayers": "a read",
    "ChooseRoute": "routes of a session are keyed by its session and request ids; a second route "
    "for them replaces the first, which was never used",
    "ReportWork": "stored once per request id",
    "ReportSessionTokens": "stored per assignment (node id, route epoch): a second delivery "
    "writes the same counts over the first",
    "ListModels": "a read",
    "ListQuarantine": "a read",
    "ListNodes": "a read",
    "FindHolders": "a read",
    "Advertise": "an announcement keyed by the holder's address, refreshed in place",
    "Renew": "a certificate for the same key and id; the one not received is never presented",
    "Revoke": "revoking an id twice revokes it once (the second reply says it was not new)",
    "Quarantine": "a verdict on a node id; a second one finds it already applied",
}
"""Calls asked once more, on the next replica, when theirs was lost with its replica, with why
that is safe. Not here: ``ReportRouteTiming`` (a second copy would weigh one measurement twice;
losing one is harmless)."""


def replica_order(client_key: str, addresses: Sequence[str]) -> tuple[int, ...]:
    """The indexes of ``addresses`` in the order the client ``client_key`` asks them: highest
    rendezvous score first (a tie, which takes a 64-bit collision, by listed order). Pure and stable
    across processes and versions (BLAKE2b, never Python's salted ``hash``), so one id always
    starts at the same replica, and each replica's score depends only on its own address: removing
    one from the list leaves every other client's first choice where it was."""
    scores = [_score(client_key, address) for address in addresses]
    return tuple(sorted(range(len(addresses)), key=lambda index: (-scores[index], index)))


def _score(client_key: str, address: str) -> int:
    # The NUL keeps ("ab", "c:1") and ("a", "bc:1") apart.
    digest = hashlib.blake2b(f"{client_key}\0{address}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass(frozen=True)
class Position:
    """The replica a call was sent to, and the ring's generation then: a failure that arrives
    after the ring moved on (and perhaps wrapped back to the same index) moves nothing."""

    index: int
    generation: int


class ReplicaRing:
    """The replicas of one tracker, the order one client walks them in, and the one it asks now.

    ``client_key`` orders them as ``replica_order`` says; None keeps the listed order (the first
    listed answers first: pinned, as tests and single-purpose tools want)."""

    def __init__(self, addresses: str, *, client_key: str | None = None, slow_strikes: int = SLOW_STRIKES) -> None:
        if slow_strikes < 1:
            raise InvalidArgument(f"slow_strikes must be >= 1, got {slow_strikes}")
        self.addresses = parse_address_list(addresses)
        self.order = (
            tuple(range(len(self.addresses))) if client_key is None else replica_order(client_key, self.addresses)
        )
        """Replica indexes in the order this client asks them, wrapping around."""
        self._slow_strikes = slow_strikes
        self._step = 0
        self._generation = 0
        self._strikes = 0

    @property
    def current(self) -> int:
        """The index (in the listed addresses) of the replica asked now: the last one that
        answered, or this client's first choice."""
        return self.order[self._step]

    def position(self) -> Position:
        return Position(self.current, self._generation)

    def answered(self, at: Position) -> None:
        """A call at ``at`` got an answer: the replica keeps up, its deadline strikes are forgiven."""
        if at.generation == self._generation:
            self._strikes = 0

    def failed(self, at: Position, failure: Failure) -> bool:
        """A call at ``at`` failed as ``failure`` says: True when this moved the client on."""
        if failure is Failure.ANSWERED:
            self.answered(at)
            return False
        if at.generation != self._generation or len(self.addresses) == 1:
            return False  # stale (another call already moved on), or nowhere to go
        if failure is Failure.SLOW:
            self._strikes += 1
            if self._strikes < self._slow_strikes:
                return False
        self._step = (self._step + 1) % len(self.order)
        self._generation += 1
        self._strikes = 0
        return True

    def elsewhere(self, at: Position) -> bool:
        """Whether the client asks another replica now than the one ``at`` named: a call lost
        there after another call's failure already moved the client on is resent here too (a
        gateway has many calls in flight when a replica dies; only the first failure moves it)."""
        return self.current != at.index

    def __len__(self) -> int:
        return len(self.addresses)


@dataclass
class RetryBudget:
    """Retries a client may still make: every call earns ``ratio`` of one, up to ``max_tokens``,
    and a retry spends one (gRPC's retry throttling). So a client resends at most about
    ``ratio`` of its calls once the first ``max_tokens`` are spent, however many replicas fail."""

    ratio: float = 0.1
    max_tokens: float = 10.0
    tokens: float = 10.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.ratio <= 1.0 or self.max_tokens < 1.0:
            raise InvalidArgument(f"retry budget: ratio in [0, 1] and max_tokens >= 1, got {self}")
        self.tokens = min(self.tokens, self.max_tokens)

    def earn(self) -> None:
        self.tokens = min(self.tokens + self.ratio, self.max_tokens)

    def spend(self) -> bool:
        """Take one retry if the budget has one."""
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True
