"""How long work records stay in etcd, and the leases that make etcd delete them itself.

Why leases: etcd keeps its whole key index in memory and refuses every write once its backend
passes its space quota (2 GB by default: the NOSPACE alarm), so records must leave; a lease
deletes its keys when it expires, inside etcd, so no replica has to scan or page through
millions of keys. One lease per time bucket (not one per record: a lease costs etcd a heap
entry and a key of its own) is granted with TTL = retention + bucket and shared by every record
this replica writes in that bucket: a record written anywhere in the bucket lives at least the
retention and at most one bucket longer. Each replica grants its own (three replicas: three
leases a bucket), so no replica waits on another's lease or its clock.

Bounds, not promises to the second: etcd re-arms every lease with its full TTL when a new leader
is elected (so an election lengthens a record's life by up to the TTL), and checks expiry
every 0.5 s. A record's dispute is written under the same lease; a settle or quarantine that
rewrites the record keeps it. Quarantines themselves are not leased: they carry their evidence
(``QuarantineEntry``) and stay until cleared.

Records written before retention existed have no lease and stay until deleted by hand
(``etcdctl del --prefix meshnet/work/``, once billing has read them).

Idempotency holds only inside the retention: a record reported again after it expired is stored
again as new. Retention must be far longer than any client's retry window (gateways' outboxes
retry for minutes; the default is days).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from meshnet.core.errors import InvalidArgument

DEFAULT_RETENTION_S = 4 * 3600.0
"""Four hours: at the issue's load (100 records/s) about 1.5 M records, ~1.0 GB of etcd backend
at the measured ~700 B a record (``bench/results/tracker_scale/etcd_retention.json``): half of
etcd's default 2 GiB quota, leaving the other half for the history kept between compactions
(the replicas' membership digests are most of it). A week at that load would be 42 GB, past the
8 GB etcd recommends as its largest quota: etcd is where replicas agree on a record (stored once,
disputes settled), not the ledger that keeps it; whoever pays from records reads them
(``list_work``) within the retention. A quieter swarm, or a larger ``--quota-backend-bytes``,
can keep more: retention * records/s * 700 B must stay well under the quota."""
MAX_BUCKET_S = 600
"""Ten minutes at most: one lease's expiry deletes its whole bucket in one apply (60 k records
at 100 records/s; 20 k took 0.06 s to revoke, ``etcd_retention.json``), so etcd's raft loop
never stalls on it; shorter buckets only add leases."""
BUCKETS_PER_RETENTION = 100
"""A short retention (tests: seconds) gets buckets of 1/100 of it, so it overshoots by ~1%."""


@dataclass(frozen=True)
class RetentionPolicy:
    """How long etcd keeps work records; ``bucket_s`` and ``lease_ttl_s`` follow from it."""

    retention_s: float = DEFAULT_RETENTION_S

    def __post_init__(self) -> None:
        if not (math.isfinite(self.retention_s) and self.retention_s >= 1):
            raise InvalidArgument(f"work retention must be at least 1 second, got {self.retention_s}")

    @property
    def bucket_s(self) -> int:
        """Seconds of writes that share one lease: 1/100 of the retention, 1 s to 10 min."""
        return min(MAX_BUCKET_S, max(1, math.ceil(self.retention_s / BUCKETS_PER_RETENTION)))

    @property
    def lease_ttl_s(self) -> int:
        """The TTL each bucket's lease is granted with: a record written at the bucket's last
        second still lives ``retention_s`` (the lease may have been granted a bucket earlier)."""
        return math.ceil(self.retention_s) + self.bucket_s

    def bucket_of(self, at: float) -> int:
        """The bucket a record written at ``at`` (seconds on any steady clock) belongs to."""
        return math.floor(at / self.bucket_s)


class BucketLeases:
    """This replica's lease for the current bucket, granted when the bucket's first record is
    written (``grant`` asks etcd for one with the given TTL and returns its id). Buckets follow
    ``clock`` (monotonic: only its pace matters, as for the lease's TTL; the records' own
    ``recorded_at`` is the tracker's wall clock, which may jump)."""

    def __init__(
        self, policy: RetentionPolicy, grant: Callable[[int], int], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.policy = policy
        self._grant = grant
        self._clock = clock
        self._lock = threading.Lock()
        self._current: tuple[int, int] | None = None  # (bucket, lease id)

    def lease_now(self) -> int:
        """The lease a record written now goes under (granted now if its bucket has none)."""
        bucket = self.policy.bucket_of(self._clock())
        with self._lock:
            if self._current is None or self._current[0] != bucket:
                self._current = (bucket, self._grant(self.policy.lease_ttl_s))
            return self._current[1]

    def forget(self, lease: int) -> None:
        """``lease`` is gone from etcd (revoked, or a store restored without it): the next
        record gets a new one."""
        with self._lock:
            if self._current is not None and self._current[1] == lease:
                self._current = None
