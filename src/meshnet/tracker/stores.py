"""Which store a tracker's configuration names: the SQLite file (one process, the default) or
an etcd cluster shared by replicas (``--store etcd://...``), with the membership exchange the
replicas then run (``tracker.etcd.membership``)."""

from __future__ import annotations

import socket

from meshnet.core.errors import InvalidArgument
from meshnet.security.invites import InviteLedger, invite_mac_key
from meshnet.tracker.checked_work import CheckedWork
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.etcd.client import EtcdClient, parse_endpoints
from meshnet.tracker.etcd.counts import SharedCounts
from meshnet.tracker.etcd.invites import EtcdInvites
from meshnet.tracker.etcd.membership import SharedMembership
from meshnet.tracker.etcd.retention import RetentionPolicy
from meshnet.tracker.etcd.store import EtcdTrackerStore
from meshnet.tracker.registry import NodeRegistry
from meshnet.tracker.revocation_feed import RevocationFeed
from meshnet.tracker.store import SqliteTrackerStore, TrackerStore
from meshnet.tracker.swarm_service import TrackerSecurity


def open_store(config: TrackerConfig) -> TrackerStore:
    if not config.store:
        return SqliteTrackerStore(config.db_path)
    retention = RetentionPolicy(config.work_retention_s)
    return EtcdTrackerStore(EtcdClient(parse_endpoints(config.store)), retention=retention)


def shared_invites(store: TrackerStore, ca_key_pem: bytes) -> InviteLedger | None:
    """Where replicas redeem join invites: their etcd store, records sealed with a key derived
    from the swarm CA's ``ca_key_pem``; None for the SQLite file (the book)."""
    if not isinstance(store, EtcdTrackerStore):
        return None
    return EtcdInvites(store.client, invite_mac_key(ca_key_pem))


def shared_membership(
    store: TrackerStore,
    registry: NodeRegistry,
    config: TrackerConfig,
    port: int,
    secured: tuple[CheckedWork, TrackerSecurity, RevocationFeed] | None,
) -> SharedMembership | None:
    """The exchange with the other replicas, for a store they share; None for the SQLite file.
    A secured tracker's shards' counts and revocations are shared too. Blocking: claims the
    replica's id and epoch slot in etcd (FailedPrecondition if another live replica holds it)."""
    if not isinstance(store, EtcdTrackerStore):
        return None
    replica = replica_id(config, port)
    membership = SharedMembership(store.client, registry, replica, config.heartbeat_interval_s)
    membership.start()
    if secured is not None:
        work, security, feed = secured
        membership.work, membership.counts = work, SharedCounts(store.client, replica)
        work.share = membership.share_counts
        membership.revocations = (security, feed)
    return membership


WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


def replica_id(config: TrackerConfig, port: int) -> str:
    """``--replica-id``, else HOST:PORT with this machine's name for a wildcard host (replicas
    on several machines all listening on 0.0.0.0:7070 would otherwise share one id)."""
    replica = config.replica_id
    if not replica:
        host = socket.gethostname() if config.host in WILDCARD_HOSTS else config.host
        replica = f"{host}:{port}"
    if "/" in replica or not replica.isprintable():
        raise InvalidArgument(f"--replica-id must be printable and without '/' (it names an etcd key), got {replica!r}")
    return replica


def describe(config: TrackerConfig) -> str:
    return config.store or f"db {config.db_path}"
