"""Revocations shared between tracker replicas through etcd.

A secured tracker keeps the revocation list in its swarm book (``security.invites.SwarmBook``, a
file in the swarm's data dir) and refuses revoked certificates from it. Replicas on different
machines each hold a copy of that data dir, so a revocation at one must reach the others' books:
each membership exchange writes this replica's revoked ids to ``revoked/<node_id>`` (revocations
are never undone, so the set only grows) and revokes here the ones another replica wrote; the
node is then refused here and WatchRevocations streams tell every member.
"""

from __future__ import annotations

import logging

from meshnet.tracker.etcd.client import EtcdClient, Put
from meshnet.tracker.etcd.store import KEY_PREFIX
from meshnet.tracker.revocation_feed import RevocationFeed
from meshnet.tracker.swarm_service import TrackerSecurity

logger = logging.getLogger(__name__)

REVOKED_PREFIX = KEY_PREFIX + "revoked/"


def exchange_revoked(client: EtcdClient, local: frozenset[str]) -> frozenset[str]:
    """Blocking: write the ids revoked here that etcd lacks; return every id revoked anywhere."""
    stored = frozenset(kv.key.removeprefix(REVOKED_PREFIX) for kv in client.get_prefix(REVOKED_PREFIX, keys_only=True))
    missing = [Put(REVOKED_PREFIX + node_id, b"") for node_id in sorted(local - stored)]
    for start in range(0, len(missing), 100):
        client.commit_if([], missing[start : start + 100])
    return stored | local


def apply_revoked(security: TrackerSecurity, feed: RevocationFeed, everywhere: frozenset[str]) -> None:
    """On the event loop: revoke here what other replicas revoked, and tell the watchers."""
    learned = everywhere - security.book.revoked()
    if not learned:
        return
    now = security.link.clock()
    for node_id in sorted(learned):
        security.book.revoke(node_id, now)
    security.refresh_revocations()
    feed.changed()
    logger.warning("nodes %s revoked at another tracker replica", ", ".join(sorted(learned)))
