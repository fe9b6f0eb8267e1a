"""Replicas of one tracker share live membership through etcd, without a write per heartbeat.

A heartbeat stays in the replica that receives it. What replicas exchange, twice per heartbeat
interval each (``EXCHANGES_PER_INTERVAL``):

- ``nodes/<id>``: a node's registration (its record, reachability and the replica that took
  it), written when a replica registers it, so every replica can route to it; withdrawn only
  when no replica hears the node (at once by the replica it left, after two expiry windows by
  any: its announcer died), so another replica can always still take a node someone hears;
- ``heard/<replica>``: the ids this replica heard in the last interval with their load, under
  this replica's own lease (TTL: one expiry window), renewed only once the fresh digest is
  written. A replica that dies stops renewing it, and the key is gone within that window; one
  not rewritten for two intervals is no longer counted (``STALE_DIGEST_INTERVALS``);
- ``replicas/<id>`` and ``epoch-slots/<k>``: claimed under that lease at start, so two live
  replicas never share an id, and each hands out only epochs equal to its slot modulo
  ``EPOCH_SLOTS`` (two replicas moving on from one epoch never hand out the same one).

Every digest put is a new version in etcd's history: each replica compacts it every
``COMPACT_EVERY_EXCHANGES`` exchanges, or etcd's quota fills and it refuses every write.

Every replica reads both prefixes at each exchange and counts a heartbeat for every node another
replica heard, so a node is alive while any replica hears it: it may heartbeat to any of them.
When a replica's digest disappears (it died), its nodes are counted as heard once more at that
moment: they get a full expiry window to move to another replica (``--tracker`` failover on the
node's side) before anyone expires them.

The epoch is shared too: each replica stores the epochs it hands out before replying
(compare-and-swap to the max, ``EtcdTrackerStore.save_epoch``) and follows the stored one through
an etcd watch (milliseconds) and each exchange's read (the safety net), so a route from any
replica is not older than what a node was told by another. Quarantines written by one
replica are applied by the others at the next exchange, and so are, on a secured tracker, shards'
token counts (``tracker.etcd.counts``) and revocations (``tracker.etcd.revocations``).

Membership reads are polls of a few prefixes per interval rather than watches: at 3 replicas and
a 2 s interval that is a few small ranges a second for the cluster, and a poll cannot miss an
event a broken watch stream would. All etcd I/O runs off the event loop; the registry is touched only on
it (``NodeRegistry`` is single-loop).

This module is the exchange's I/O: the lease and claims, reads and writes of the prefixes above,
compaction. What a snapshot of them means for the local registry is ``membership_apply``'s,
which keys are withdrawn and when ``membership_rules``' (pure), and the values passed between
them and the digest codec are ``membership_values``'.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import threading
from dataclasses import dataclass, field

from meshnet.core.errors import FailedPrecondition, InvalidArgument, MeshnetError, StorageDamaged, StorageFull
from meshnet.core.ids import NodeId
from meshnet.core.tracking import NodeLoad, SessionTokens
from meshnet.tracker.checked_work import CheckedWork
from meshnet.tracker.etcd.client import Delete, EtcdClient, EtcdRefused, KeyValue, Put
from meshnet.tracker.etcd.counts import SharedCounts
from meshnet.tracker.etcd.membership_apply import LocalMembership
from meshnet.tracker.etcd.membership_rules import STALE_KEY_WINDOWS, plan_withdrawals
from meshnet.tracker.etcd.membership_values import (
    Announcement,
    Outbound,
    Snapshot,
    Written,
    decode_digest,
    encode_digest,
)
from meshnet.tracker.etcd.revocations import apply_revoked, exchange_revoked
from meshnet.tracker.etcd.store import EPOCH_KEY, KEY_PREFIX, QUARANTINE_PREFIX, decode_int
from meshnet.tracker.registry import NodeRegistry
from meshnet.tracker.revocation_feed import RevocationFeed
from meshnet.tracker.swarm_service import TrackerSecurity

logger = logging.getLogger(__name__)

NODES_PREFIX = KEY_PREFIX + "nodes/"
HEARD_PREFIX = KEY_PREFIX + "heard/"
REPLICAS_PREFIX = KEY_PREFIX + "replicas/"
"""``replicas/<id>``: claimed by the live replica of that id, under its lease."""
SLOTS_PREFIX = KEY_PREFIX + "epoch-slots/"
EPOCH_SLOTS = 64
"""At most this many live replicas: each claims a slot ``k`` and hands out only epochs equal to
``k`` modulo ``EPOCH_SLOTS``, so two replicas moving on from one epoch never hand out the same."""
EXCHANGES_PER_INTERVAL = 2
"""Exchanges per heartbeat interval. A heartbeat reaches another replica through two of them (a
publish, then a read): at one per interval, the gaps between the counts of one node there could
approach two intervals plus the I/O, against an expiry window of three; at two, one interval."""
FETCH_ONE_BY_ONE = 64
"""Up to this many registrations are read one by one; more (a mass join) in one prefix read."""
COMPACT_EVERY_EXCHANGES = 60
"""About a minute at the default 2 s interval: etcd then keeps one to two minutes of history
(at 3,000 nodes and 3 replicas, ~0.1 GB) instead of all of it."""
STALE_DIGEST_INTERVALS = 2
"""A digest not rewritten for this many intervals (its replica rewrites it twice per interval) is
no longer counted, though its lease may live on (a replica whose writes fail, etcd out of space,
while its keepalives succeed): its nodes then get the grace of a replica that died."""
MAX_TXN_OPERATIONS = 128
"""etcd's default ``--max-txn-ops``."""


def readable_digests(kvs: list[KeyValue], own_key: str) -> dict[str, dict[NodeId, NodeLoad]]:
    """Other replicas' digests by replica; a malformed one is skipped (logged), not fatal."""
    digests = {}
    for kv in kvs:
        if kv.key == own_key:
            continue
        try:
            digests[kv.key.removeprefix(HEARD_PREFIX)] = decode_digest(kv.value)
        except InvalidArgument as error:
            logger.warning("%s: %s", kv.key, error.message)
    return digests


@dataclass
class SharedMembership:
    """One replica's side of the exchange; ``run_forever`` is a background task of the tracker."""

    client: EtcdClient
    registry: NodeRegistry
    replica_id: str
    interval_s: float
    compact_every: int = COMPACT_EVERY_EXCHANGES
    """Exchanges between two compactions of etcd's history."""
    _lease: int = 0
    _slot: int = 0
    _token: str = field(default_factory=lambda: secrets.token_hex(8))
    """This process's claim on ``replicas/<replica_id>``: another process claiming the same id is refused."""
    _unheard: dict[NodeId, tuple[float, int]] = field(default_factory=dict)
    """Keys no replica hears (I/O thread only): since when, at which mod_revision."""
    _digest_seen: dict[str, tuple[float, int]] = field(default_factory=dict)
    """Other replicas' digest keys (I/O thread only): since when at which mod_revision."""
    _exchanges: int = 0
    _compact_mark: int = 0
    """The revision of the last compaction's exchange: the next compaction drops history before it."""
    work: CheckedWork | None = None
    """The secured tracker's work records: fed the counts shards reported to other replicas."""
    counts: SharedCounts | None = None
    revocations: tuple[TrackerSecurity, RevocationFeed] | None = None
    """A secured tracker's book and feed: revocations are shared too (``tracker.etcd.revocations``)."""
    watching: threading.Event = field(default_factory=threading.Event)
    """Set once the epoch watch stream is open (etcd confirmed it)."""
    local: LocalMembership = field(init=False)
    """The registry's side: what it publishes, and what others' digests mean for it."""

    def __post_init__(self) -> None:
        self.local = LocalMembership(self.registry, self.interval_s)

    def claim(self) -> None:
        """Blocking: take a lease and claim ``replicas/<replica_id>`` under it; FailedPrecondition
        if another live process holds that id (two replicas of one id would each skip the
        other's digest as its own, and neither would count the other's heartbeats)."""
        ttl = max(1, math.ceil(self.registry.expire_after_s))
        lease = self.client.grant_lease(ttl)
        stored = self.client.create(REPLICAS_PREFIX + self.replica_id, self._token.encode(), lease=lease)
        if stored is not None and stored.value != self._token.encode():
            raise FailedPrecondition(
                f"tracker replica id {self.replica_id!r} is held by another live replica of this store: "
                f"give each replica its own --replica-id (or wait {ttl} s for a dead one's lease to lapse)"
            )
        self._slot = self._claim_slot(lease)
        self._lease = lease

    def start(self) -> None:
        """Blocking, on the event loop before serving: claim this replica's id and epoch slot,
        and hand out only epochs of that slot from now on."""
        self.claim()
        self.registry.next_epoch = self.next_epoch
        self.registry.follow_epoch(self.next_epoch(self.registry.epoch))

    def next_epoch(self, epoch: int) -> int:
        """The smallest epoch above ``epoch`` of this replica's slot."""
        return epoch + (self._slot - epoch - 1) % EPOCH_SLOTS + 1

    def _claim_slot(self, lease: int) -> int:
        for slot in range(EPOCH_SLOTS):
            stored = self.client.create(SLOTS_PREFIX + str(slot), self._token.encode(), lease=lease)
            if stored is None or stored.value == self._token.encode():
                return slot
        raise FailedPrecondition(
            f"more than {EPOCH_SLOTS} tracker replicas share this store: every epoch slot is taken"
        )

    async def run_forever(self) -> None:
        stopped = threading.Event()
        watch = threading.Thread(target=self._follow_epoch, args=(asyncio.get_running_loop(), stopped), daemon=True)
        watch.start()
        try:
            while True:
                try:
                    await self.exchange()
                except StorageFull as error:  # the store's client logs the alarm once, not per exchange
                    logger.debug("membership exchange with etcd refused: %s", error.message)
                except MeshnetError as error:  # etcd unreachable: keep serving what we know
                    logger.warning("membership exchange with etcd failed: %s", error.message)
                except Exception:  # a bug or bad data must not stop this replica publishing
                    logger.exception("membership exchange with etcd failed")
                await asyncio.sleep(self.interval_s / EXCHANGES_PER_INTERVAL)
        finally:
            stopped.set()  # the watch thread ends within one idle read (it is a daemon anyway)

    def _follow_epoch(self, loop: asyncio.AbstractEventLoop, stopped: threading.Event) -> None:
        """Follow the stored epoch as soon as another replica raises it (the exchange's read is
        the safety net): a gateway failing over to this replica must get a route of an epoch no
        older than the one its shards were told, or they refuse it as stale."""

        def follow(value: bytes) -> None:
            if value.isdigit():
                loop.call_soon_threadsafe(self.registry.follow_epoch, int(value))

        self.client.follow(EPOCH_KEY, follow, stopped, self.watching)

    async def exchange(self) -> None:
        """Publish what this replica heard and registered; apply what the others did."""
        revoked = None if self.revocations is None else self.revocations[0].book.revoked()
        outbound = self.local.outbound(revoked)
        snapshot = await asyncio.to_thread(self._io, outbound)
        await self._apply(outbound, snapshot)

    def _io(self, outbound: Outbound) -> Snapshot:
        """Blocking etcd calls (a worker thread): the writes, then what the others published."""
        announced = self._announce(outbound.announcements)
        fresh = self._fresh(self.client.get_prefix(HEARD_PREFIX), outbound.now)
        digests = readable_digests(fresh, HEARD_PREFIX + self.replica_id)
        keys = {
            NodeId(kv.key.removeprefix(NODES_PREFIX)): kv.mod_revision
            for kv in self.client.get_prefix(NODES_PREFIX, keys_only=True)
        }
        heard_anywhere = {node for digest in digests.values() for node in digest} | set(outbound.heard)
        settled = self._withdraw(outbound, keys, heard_anywhere)
        revision = self._publish(encode_digest(outbound.heard))
        self._compact(revision)
        quarantined = frozenset(
            NodeId(kv.key.removeprefix(QUARANTINE_PREFIX)) for kv in self.client.get_prefix(QUARANTINE_PREFIX)
        )
        epoch = self._stored_epoch()
        held = {**outbound.adopted_revision, **outbound.announced_revision, **announced}
        registrations = self._registrations_wanted(outbound.known, held, keys, digests)
        counts, through = ([], 0) if self.counts is None else self.counts.others_since_last()
        revoked = None if outbound.revoked is None else exchange_revoked(self.client, outbound.revoked)
        written = Written(announced, settled, keys)
        revisions = {kv.key.removeprefix(HEARD_PREFIX): kv.mod_revision for kv in fresh}
        return Snapshot(registrations, digests, quarantined, epoch, counts, through, revoked, written, revisions)

    def _fresh(self, kvs: list[KeyValue], now: float) -> list[KeyValue]:
        """The digests rewritten within ``STALE_DIGEST_INTERVALS`` intervals."""
        seen, fresh = {}, []
        for kv in kvs:
            since, revision = self._digest_seen.get(kv.key, (now, kv.mod_revision))
            seen[kv.key] = (now, kv.mod_revision) if revision != kv.mod_revision else (since, revision)
            if now - seen[kv.key][0] <= STALE_DIGEST_INTERVALS * self.interval_s:
                fresh.append(kv)
            elif now - since - self.interval_s / EXCHANGES_PER_INTERVAL <= STALE_DIGEST_INTERVALS * self.interval_s:
                logger.warning("%s was not rewritten for %.0f s: its nodes are no longer counted", kv.key, now - since)
        self._digest_seen = seen
        return fresh

    def _stored_epoch(self) -> int:
        """The epoch other replicas stored; 0 (this replica keeps its own) if it is unreadable."""
        stored = self.client.get(EPOCH_KEY)
        try:
            return 0 if stored is None else decode_int(stored)
        except StorageDamaged as error:
            logger.error("%s: the stored epoch is not followed until a replica rewrites it", error.message)
            return 0

    def _announce(self, announcements: list[Announcement]) -> dict[NodeId, int]:
        """Write ``nodes/<id>`` of each announcement; the revision each was written at."""
        written = {}
        writes = [Put(NODES_PREFIX + item.node_id, item.encode(self.replica_id)) for item in announcements]
        # etcd refuses a transaction of more than 128 operations: a mass join is several.
        for start in range(0, len(writes), MAX_TXN_OPERATIONS):
            revision = self.client.write(writes[start : start + MAX_TXN_OPERATIONS])
            for item in announcements[start : start + MAX_TXN_OPERATIONS]:
                written[item.node_id] = revision
        return written

    def _withdraw(self, outbound: Outbound, keys: dict[NodeId, int], heard: set[NodeId]) -> frozenset[NodeId]:
        """Delete the keys of nodes no replica hears, as ``membership_rules`` decides; the
        departed nodes whose key is gone (deleted now, rewritten elsewhere, or absent)."""
        stale_after_s = STALE_KEY_WINDOWS * self.registry.expire_after_s
        withdrawals = plan_withdrawals(outbound, keys, heard, self._unheard, stale_after_s)
        for node_id, revision in withdrawals.deletes:
            key = NODES_PREFIX + node_id
            self.client.commit_if([(key, revision)], [Delete(key)])
        self._unheard = withdrawals.unheard
        return withdrawals.settled

    def _publish(self, digest: bytes) -> int:
        """Write this replica's digest under its lease, renewing the lease only once the fresh
        digest is written (a replica that cannot write must not keep an old digest alive); the
        revision it was written at."""
        key = HEARD_PREFIX + self.replica_id
        if self._lease:
            try:
                revision = self.client.put(key, digest, self._lease)
            except EtcdRefused:  # the lease is gone (expired while etcd was out of reach)
                self._lease = 0
            else:
                if self.client.keep_alive(self._lease):
                    return revision
                self._lease = 0
        self.claim()
        return self.client.put(key, digest, self._lease)

    def _compact(self, revision: int) -> None:
        """Every ``compact_every`` exchanges, drop etcd's history before the previous mark: each
        digest put is a new version of a value of up to ~0.2 MB, which etcd keeps until compacted
        (uncompacted, 3 replicas fill etcd's 2 GB quota in about an hour, then every write fails)."""
        self._exchanges += 1
        if self._exchanges % self.compact_every:
            return
        if self._compact_mark:
            try:
                self.client.compact(self._compact_mark)
            except MeshnetError as error:  # tried again next time; etcd's own compaction backs it
                logger.warning("etcd history not compacted: %s", error.message)
                return
        self._compact_mark = revision

    def _registrations_wanted(
        self,
        known: frozenset[NodeId],
        held: dict[NodeId, int],
        revisions: dict[NodeId, int],
        digests: dict[str, dict[NodeId, NodeLoad]],
    ) -> dict[NodeId, KeyValue]:
        """The registrations of nodes others heard that are new here, or that registered again
        elsewhere since this replica took or announced them (``held``: the revision each record
        held here came from)."""
        heard = {node for digest in digests.values() for node in digest}
        wanted = [
            node
            for node in heard
            if node in revisions and (node not in known or held.get(node, revisions[node]) != revisions[node])
        ]
        if len(wanted) > FETCH_ONE_BY_ONE:
            everything = {NodeId(kv.key.removeprefix(NODES_PREFIX)): kv for kv in self.client.get_prefix(NODES_PREFIX)}
            return {node: everything[node] for node in wanted if node in everything}
        found = {node: self.client.get(NODES_PREFIX + node) for node in wanted}
        return {node: kv for node, kv in found.items() if kv is not None}

    async def _apply(self, outbound: Outbound, snapshot: Snapshot) -> None:
        self.local.settle(outbound, snapshot)
        if self.revocations is not None and snapshot.revoked is not None:
            apply_revoked(*self.revocations, snapshot.revoked)
        await self.local.follow(snapshot)
        if self.work is not None:
            for node_id, sessions in snapshot.counts:
                try:
                    await self.work.take_counts(node_id, sessions)
                except MeshnetError as error:  # one bad record must not hold back the others
                    logger.warning("shard counts of %s from another replica not taken: %s", node_id, error.message)
        if self.counts is not None:
            self.counts.read_through(snapshot.counts_through)

    async def share_counts(self, node_id: NodeId, sessions: tuple[SessionTokens, ...]) -> None:
        """Publish counts a shard reported here, for the replica that routed its session."""
        if self.counts is None:
            return
        try:
            await asyncio.to_thread(self.counts.publish, node_id, sessions)
        except MeshnetError as error:  # this replica judges with them anyway; others may dispute
            logger.warning("shard counts from %s not shared with other replicas: %s", node_id, error.message)
