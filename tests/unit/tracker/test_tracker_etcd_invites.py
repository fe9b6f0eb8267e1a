"""Join invites in etcd (``tracker.etcd.invites``) against a real etcd: the book's promises
(single use, expiry, forged secrets refused) kept across replicas, each with its own client."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from etcd_harness import needs_etcd

from meshnet.core.errors import InvalidArgument, MeshnetError, StorageDamaged
from meshnet.deploy.etcd_cluster import EtcdCluster, etcd_cluster
from meshnet.security.invites import InviteRefused, InviteUnsealed, invite_digest, invite_mac_key
from meshnet.tracker.etcd.client import EtcdClient, Operation, parse_endpoints
from meshnet.tracker.etcd.invites import EXPIRED_KEPT_S, INVITES_PREFIX, EtcdInvites

pytestmark = needs_etcd
NOW = 1_000_000.0
MAC_KEY = invite_mac_key(b"-----BEGIN PRIVATE KEY-----\nthe swarm CA's key\n")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    with etcd_cluster(tmp_path, size=1) as started:
        yield started


def replica(cluster: EtcdCluster) -> EtcdInvites:
    return EtcdInvites(EtcdClient(parse_endpoints(cluster.store)), MAC_KEY, clock=lambda: NOW)


def test_an_invite_made_at_one_replica_is_spent_once_across_replicas(cluster: EtcdCluster) -> None:
    a, b = replica(cluster), replica(cluster)
    secret = a.create_invite("gateway", expires_at_unix_s=NOW + 60, max_uses=1)
    assert b.redeem(secret, NOW) == "gateway"
    with pytest.raises(InviteRefused, match="already used 1 of 1"):
        a.redeem(secret, NOW)


def test_joiners_racing_at_several_replicas_get_exactly_the_invites_uses(cluster: EtcdCluster) -> None:
    replicas = [replica(cluster) for _ in range(3)]
    secret = replicas[0].create_invite("worker", expires_at_unix_s=NOW + 60, max_uses=3)
    granted: list[str] = []
    refused: list[MeshnetError] = []
    start = threading.Barrier(9)

    def join(ledger: EtcdInvites) -> None:
        start.wait()
        try:
            granted.append(ledger.redeem(secret, NOW))
        except InviteRefused as error:
            refused.append(error)

    joiners = [threading.Thread(target=join, args=(replicas[index % 3],)) for index in range(9)]
    for joiner in joiners:
        joiner.start()
    for joiner in joiners:
        joiner.join()
    assert granted == ["worker"] * 3
    assert len(refused) == 6
    assert all("already used 3 of 3" in error.message for error in refused)


def test_expired_forged_and_invalid_invites_are_refused(cluster: EtcdCluster) -> None:
    ledger = replica(cluster)
    expired = ledger.create_invite("worker", expires_at_unix_s=NOW, max_uses=1)
    with pytest.raises(InviteRefused, match="expired"):
        ledger.redeem(expired, NOW)
    with pytest.raises(InviteRefused, match="unknown"):
        ledger.redeem("x" * 32, NOW)
    with pytest.raises(InvalidArgument):
        ledger.create_invite("tracker", expires_at_unix_s=NOW + 60, max_uses=1)
    with pytest.raises(InvalidArgument):
        ledger.create_invite("worker", expires_at_unix_s=NOW + 60, max_uses=0)


def test_an_invite_keeps_its_lease_when_spent_and_only_its_digest_is_stored(cluster: EtcdCluster) -> None:
    ledger, client = replica(cluster), EtcdClient(parse_endpoints(cluster.store))
    secret = ledger.create_invite("worker", expires_at_unix_s=NOW + 100, max_uses=2)
    ledger.redeem(secret, NOW)
    stored = client.get(INVITES_PREFIX + invite_digest(secret))
    assert stored is not None and stored.lease != 0  # etcd drops it when the lease ends
    assert secret.encode() not in stored.value
    ttl = client._post("/v3/lease/timetolive", {"ID": str(stored.lease)})
    assert EXPIRED_KEPT_S < int(ttl["grantedTTL"]) <= EXPIRED_KEPT_S + 100


def test_a_malformed_stored_invite_is_refused_as_damaged(cluster: EtcdCluster) -> None:
    ledger, client = replica(cluster), EtcdClient(parse_endpoints(cluster.store))
    client.put(INVITES_PREFIX + invite_digest("s" * 32), b'{"role": "worker"}')
    with pytest.raises(StorageDamaged, match="lacks"):
        ledger.redeem("s" * 32, NOW)


def test_an_invite_written_to_etcd_without_the_ca_key_is_refused(cluster: EtcdCluster) -> None:
    """Anyone who can write to etcd writes an admin invite of their own, sealed with a key they
    chose, or alters a real invite's role: no replica redeems either."""
    client = EtcdClient(parse_endpoints(cluster.store))
    forger = EtcdInvites(client, invite_mac_key(b"not the swarm's CA key"), clock=lambda: NOW)
    forged = forger.create_invite("admin", expires_at_unix_s=NOW + 60, max_uses=1)
    with pytest.raises(InviteUnsealed, match="seal"):
        replica(cluster).redeem(forged, NOW)
    genuine = replica(cluster).create_invite("worker", expires_at_unix_s=NOW + 60, max_uses=1)
    key = INVITES_PREFIX + invite_digest(genuine)
    stored = client.get(key)
    assert stored is not None
    altered = json.loads(stored.value) | {"role": "admin", "max_uses": 10}
    client.put(key, json.dumps(altered).encode(), stored.lease)
    with pytest.raises(InviteUnsealed):
        replica(cluster).redeem(genuine, NOW)


class RepliedLateClient(EtcdClient):
    """A client whose transactions are applied but whose first reply is lost: what ``_post`` does
    when a member applies a transaction and times out, and the next member is asked again (its
    compare then fails on the revision the first one wrote)."""

    def commit_if(self, unchanged: Sequence[tuple[str, int]], operations: Sequence[Operation]) -> bool:
        super().commit_if(unchanged, operations)
        return super().commit_if(unchanged, operations)


def test_a_redeem_whose_applied_transaction_is_retried_spends_one_use(cluster: EtcdCluster) -> None:
    creator = replica(cluster)
    late = EtcdInvites(RepliedLateClient(parse_endpoints(cluster.store)), MAC_KEY, clock=lambda: NOW)
    once = creator.create_invite("worker", expires_at_unix_s=NOW + 60, max_uses=1)
    assert late.redeem(once, NOW) == "worker"  # its one use is this joiner's, not refused as spent
    twice = creator.create_invite("worker", expires_at_unix_s=NOW + 60, max_uses=2)
    assert late.redeem(twice, NOW) == "worker"
    assert creator.redeem(twice, NOW) == "worker"  # the second use is still there
    with pytest.raises(InviteRefused, match="already used 2 of 2"):
        creator.redeem(twice, NOW)
