"""The retention's arithmetic, without etcd: how long a bucket is, the TTL its lease is granted
with, and that every record written under a bucket's lease lives at least the retention and at
most one bucket longer (checked against a simulation of etcd's lease clock, not the formula)."""

from __future__ import annotations

import random

import pytest

from meshnet.core.durations import Seconds, parse_duration
from meshnet.core.errors import InvalidArgument
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.etcd.client import wrote
from meshnet.tracker.etcd.retention import BucketLeases, RetentionPolicy


@pytest.mark.parametrize(
    ("retention_s", "bucket_s", "ttl_s"),
    [(4 * 3600.0, 144, 4 * 3600 + 144), (7 * 86400.0, 600, 7 * 86400 + 600), (3.0, 1, 4), (250.0, 3, 253), (2.5, 1, 4)],
)
def test_bucket_and_ttl(retention_s: float, bucket_s: int, ttl_s: int) -> None:
    policy = RetentionPolicy(retention_s)
    assert (policy.bucket_s, policy.lease_ttl_s) == (bucket_s, ttl_s)


def test_buckets_are_whole_intervals_of_the_clock() -> None:
    policy = RetentionPolicy(300.0)  # buckets of 3 s
    assert [policy.bucket_of(at) for at in (0.0, 2.999, 3.0, 5.9, 6.0, -0.5)] == [0, 0, 1, 1, 2, -1]


@pytest.mark.parametrize("retention_s", [0.0, 0.5, -5.0, float("inf"), float("nan")])
def test_a_retention_etcd_cannot_keep_is_refused(retention_s: float) -> None:
    with pytest.raises(InvalidArgument):
        RetentionPolicy(retention_s)
    with pytest.raises(InvalidArgument):
        TrackerConfig(work_retention_s=Seconds(retention_s))


class Etcd:
    """etcd's side of leases as a test oracle: each grant's time and TTL, by lease id."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.granted: dict[int, tuple[float, int]] = {}

    def grant(self, ttl_s: int) -> int:
        lease = len(self.granted) + 1
        self.granted[lease] = (self.clock[0], ttl_s)
        return lease

    def expires_at(self, lease: int) -> float:
        granted_at, ttl_s = self.granted[lease]
        return granted_at + ttl_s


@pytest.mark.parametrize("retention_s", [1.0, 3.0, 250.0, 4 * 3600.0, 7 * 86400.0])
def test_every_record_lives_the_retention_and_at_most_a_bucket_more(retention_s: float) -> None:
    now = [1_000.0]
    etcd = Etcd(now)
    policy = RetentionPolicy(retention_s)
    leases = BucketLeases(policy, etcd.grant, clock=lambda: now[0])
    rng = random.Random(36)
    for _ in range(2_000):
        now[0] += rng.expovariate(4.0 / policy.bucket_s)  # a few records a bucket, some buckets empty
        lifetime = etcd.expires_at(leases.lease_now()) - now[0]
        assert retention_s <= lifetime <= retention_s + policy.bucket_s + 1
    buckets = policy.bucket_of(now[0]) - policy.bucket_of(1_000.0) + 1
    assert len(etcd.granted) <= buckets  # one lease a bucket at most, not one a record


def test_a_forgotten_lease_is_granted_again_and_another_is_not_forgotten() -> None:
    now = [0.0]
    etcd = Etcd(now)
    leases = BucketLeases(RetentionPolicy(100.0), etcd.grant, clock=lambda: now[0])
    first = leases.lease_now()
    assert leases.lease_now() == first
    leases.forget(first + 99)  # not the lease held: kept
    assert leases.lease_now() == first
    leases.forget(first)
    assert leases.lease_now() != first and len(etcd.granted) == 2


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("1.5h", 5400.0), ("7d", 604800.0)]
)
def test_durations_read_as_flags_write_them(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds == Seconds.parse(text)


@pytest.mark.parametrize("text", ["", "7w", "-1h", "1e9999", "h", "1 d x"])
def test_a_duration_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_duration(text)


def test_only_a_put_or_a_grant_shows_the_space_alarm_is_off() -> None:
    put = {"success": [{"request_put": {"key": "a"}}]}
    delete = {"success": [{"request_delete_range": {"key": "a"}}]}
    assert wrote("/v3/lease/grant", {}, {})
    assert wrote("/v3/kv/txn", put, {"succeeded": True})
    assert not wrote("/v3/kv/txn", put, {"succeeded": False})  # its compare failed: nothing written
    assert not wrote("/v3/kv/txn", delete, {"succeeded": True})
    assert not wrote("/v3/kv/range", {}, {})
