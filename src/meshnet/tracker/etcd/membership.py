"""Replicas of one tracker share live membership through etcd, without a write per heartbeat.

A heartbeat stays in the replica that receives it. What replicas exchange, twice per heartbeat
interval each (``EXCHANGES_PER_INTERVAL``):

- ``nodes/<id>``: a node's registration (its record, reachability and the replica that took
  it), written when a replica registers it, so every replica can route to it;
- ``heard/<replica>``: the ids this replica heard in the last interval with their load, under
  this replica's own lease (TTL: one expiry window). A replica that dies stops renewing it, and
  the key is gone within that window.

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
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import threading
from dataclasses import dataclass, field, replace

from google.protobuf.message import DecodeError

from meshnet.core.errors import InvalidArgument, MeshnetError
from meshnet.core.ids import NodeId
from meshnet.core.reachability import REACHABILITIES, Reachability
from meshnet.core.tracking import NodeLoad, SessionTokens
from meshnet.tracker.checked_work import CheckedWork
from meshnet.tracker.etcd.client import Delete, EtcdClient, KeyValue, Put
from meshnet.tracker.etcd.counts import Counts, SharedCounts
from meshnet.tracker.etcd.revocations import apply_revoked, exchange_revoked
from meshnet.tracker.etcd.store import EPOCH_KEY, KEY_PREFIX, QUARANTINE_PREFIX
from meshnet.tracker.registry import NodeEntry, NodeRegistry
from meshnet.tracker.revocation_feed import RevocationFeed
from meshnet.tracker.swarm_service import TrackerSecurity
from meshnet.wire import services, tracker_wire

logger = logging.getLogger(__name__)

NODES_PREFIX = KEY_PREFIX + "nodes/"
HEARD_PREFIX = KEY_PREFIX + "heard/"
EXCHANGES_PER_INTERVAL = 2
"""Exchanges per heartbeat interval. A heartbeat reaches another replica through two of them (a
publish, then a read): at one per interval, the gaps between the counts of one node there could
approach two intervals plus the I/O, against an expiry window of three; at two, one interval."""
APPLY_CHUNK = 20
"""Nodes counted between two yields to the event loop. Each registry call still scans every
node (its sweep, and a registration's address check: ``tracker.registry``), so at 3,000 nodes
counting all at once held the loop for 0.4-1.5 s, and a mass adoption costs ~1-3 ms a node."""
FETCH_ONE_BY_ONE = 64
"""Up to this many registrations are read one by one; more (a mass join) in one prefix read."""
MAX_TXN_OPERATIONS = 128
"""etcd's default ``--max-txn-ops``."""


@dataclass(frozen=True)
class Announcement:
    """A node registered at this replica, as ``nodes/<id>`` carries it."""

    node_id: NodeId
    registration: bytes
    """``NodeRegistration`` protobuf: the wire's own validated codec for a record."""
    reachability: Reachability

    def encode(self, replica: str) -> bytes:
        registration = base64.b64encode(self.registration).decode()
        return json.dumps(
            {"registration": registration, "reachability": self.reachability, "replica": replica}
        ).encode()


@dataclass(frozen=True)
class Outbound:
    """What one exchange writes, and what it knows locally (read on the event loop)."""

    announcements: list[Announcement]
    heard: dict[NodeId, NodeLoad]
    known: frozenset[NodeId]
    adopted_revision: dict[NodeId, int]
    revoked: frozenset[str] | None
    """Ids this replica's book revoked (None: not a secured tracker)."""
    withdrawn: dict[NodeId, int]
    """Nodes this replica announced that left it, by the revision of its announcement."""


@dataclass(frozen=True)
class Snapshot:
    """What one exchange read from etcd."""

    registrations: dict[NodeId, KeyValue]
    """Only the registrations this replica needs: nodes new here or registered again elsewhere."""
    heard: dict[str, dict[NodeId, NodeLoad]]
    """Other live replicas' digests: replica → node → load."""
    quarantined: frozenset[NodeId]
    epoch: int
    counts: list[Counts] = field(default_factory=list)
    """Shards' counts other replicas took since the last exchange (``tracker.etcd.counts``)."""
    revoked: frozenset[str] | None = None
    """Every id revoked at any replica (None: not a secured tracker)."""


def compact(load: NodeLoad) -> NodeLoad:
    """The load a digest carries: without the peer round trips, which stay with the replica that
    heard them (12 peers per node would make a 3,000-node digest 1.5 MB, etcd's request limit;
    without, 0.2 MB: ``bench/results/tracker_scale/etcd_store.json``)."""
    return replace(load, peer_rtt_ms=())


def encode_digest(heard: dict[NodeId, NodeLoad]) -> bytes:
    """A digest's value: node id → its compact load as ``NodeHeartbeat`` protobuf (base64)."""
    loads = {
        node: base64.b64encode(tracker_wire.heartbeat_to_proto(node, compact(load)).SerializeToString()).decode()
        for node, load in heard.items()
    }
    return json.dumps(loads).encode()


def decode_digest(value: bytes) -> dict[NodeId, NodeLoad]:
    """A digest's nodes and loads; InvalidArgument if it is not one (whoever wrote it)."""
    heard: dict[NodeId, NodeLoad] = {}
    try:
        for encoded in json.loads(value).values():
            message = services.NodeHeartbeat.FromString(base64.b64decode(encoded))
            node_id, load = tracker_wire.heartbeat_from_proto(message)
            heard[node_id] = load
    except (ValueError, TypeError, AttributeError, DecodeError) as error:
        raise InvalidArgument(f"a membership digest in etcd is malformed: {error}") from None
    return heard


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
    _lease: int = 0
    _announced: dict[NodeId, float] = field(default_factory=dict)
    """Nodes this replica announced, by the registered_at it announced."""
    _announced_revision: dict[NodeId, int] = field(default_factory=dict)
    """The etcd revision each of this replica's announcements was written at."""
    _adopted: dict[NodeId, float] = field(default_factory=dict)
    """Nodes this replica registered from another's announcement, by their registered_at."""
    _adopted_revision: dict[NodeId, int] = field(default_factory=dict)
    """The etcd revision of the announcement each adopted node was registered from."""
    _counted: dict[NodeId, float] = field(default_factory=dict)
    """The last_seen this replica set when counting another replica's heartbeat."""
    work: CheckedWork | None = None
    """The secured tracker's work records: fed the counts shards reported to other replicas."""
    counts: SharedCounts | None = None
    revocations: tuple[TrackerSecurity, RevocationFeed] | None = None
    """A secured tracker's book and feed: revocations are shared too (``tracker.etcd.revocations``)."""
    _previous: Snapshot | None = None

    async def run_forever(self) -> None:
        stopped = threading.Event()
        watch = threading.Thread(target=self._follow_epoch, args=(asyncio.get_running_loop(), stopped), daemon=True)
        watch.start()
        try:
            while True:
                try:
                    await self.exchange()
                except MeshnetError as error:  # etcd unreachable: keep serving what we know
                    logger.warning("membership exchange with etcd failed: %s", error.message)
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

        self.client.follow(EPOCH_KEY, follow, stopped)

    async def exchange(self) -> None:
        """Publish what this replica heard and registered; apply what the others did."""
        snapshot = await asyncio.to_thread(self._io, self._outbound())
        await self._apply(snapshot)

    def _outbound(self) -> Outbound:
        since = self.registry.now() - self.interval_s
        announcements, heard = [], {}
        for entry in self.registry.entries():
            mine = self._adopted.get(entry.node_id) != entry.registered_at
            if mine and self._announced.get(entry.node_id) != entry.registered_at:
                registration = tracker_wire.registration_to_proto(entry.record, entry.node_id).SerializeToString()
                announcements.append(Announcement(entry.node_id, registration, entry.reachability))
                self._announced[entry.node_id] = entry.registered_at
            # Heard here within the last interval, and not only by this replica counting another's
            # digest (that left last_seen at the value it set).
            heard_here = entry.last_seen >= since and self._counted.get(entry.node_id) != entry.last_seen
            if heard_here:
                heard[entry.node_id] = entry.load or NodeLoad()
        known = frozenset(entry.node_id for entry in self.registry.entries())
        revoked = None if self.revocations is None else self.revocations[0].book.revoked()
        return Outbound(
            announcements, heard, known, dict(self._adopted_revision), revoked, self._forget_departed(known)
        )

    def _forget_departed(self, known: frozenset[NodeId]) -> dict[NodeId, int]:
        """Drop what this replica kept of nodes no longer here; those it announced, by the
        revision it wrote them at (their keys are withdrawn unless another replica rewrote them)."""
        for table in (self._adopted, self._adopted_revision, self._counted):
            for node_id in [node for node in table if node not in known]:
                del table[node_id]
        departed = {node: self._announced_revision.pop(node, 0) for node in self._announced if node not in known}
        for node_id in departed:
            del self._announced[node_id]
        return {node: revision for node, revision in departed.items() if revision}

    def _io(self, outbound: Outbound) -> Snapshot:
        """Blocking etcd calls (a worker thread): the writes, then what the others published."""
        if not self._lease or not self.client.keep_alive(self._lease):
            ttl = max(1, math.ceil(self.registry.expire_after_s))
            self._lease = self.client.grant_lease(ttl)
        writes = [Put(NODES_PREFIX + item.node_id, item.encode(self.replica_id)) for item in outbound.announcements]
        # etcd refuses a transaction of more than 128 operations: a mass join is several.
        for start in range(0, len(writes), MAX_TXN_OPERATIONS):
            revision = self.client.write(writes[start : start + MAX_TXN_OPERATIONS])
            for item in outbound.announcements[start : start + MAX_TXN_OPERATIONS]:
                self._announced_revision[item.node_id] = revision
        for node_id, revision in outbound.withdrawn.items():
            key = NODES_PREFIX + node_id
            self.client.commit_if([(key, revision)], [Delete(key)])
        self.client.put(HEARD_PREFIX + self.replica_id, encode_digest(outbound.heard), self._lease)
        digests = readable_digests(self.client.get_prefix(HEARD_PREFIX), HEARD_PREFIX + self.replica_id)
        quarantined = frozenset(
            NodeId(kv.key.removeprefix(QUARANTINE_PREFIX)) for kv in self.client.get_prefix(QUARANTINE_PREFIX)
        )
        stored_epoch = self.client.get(EPOCH_KEY)
        registrations = self._registrations_wanted(outbound, digests)
        epoch = 0 if stored_epoch is None else int(stored_epoch.value)
        counts = [] if self.counts is None else self.counts.others_since_last()
        revoked = None if outbound.revoked is None else exchange_revoked(self.client, outbound.revoked)
        return Snapshot(registrations, digests, quarantined, epoch, counts, revoked)

    def _registrations_wanted(
        self, outbound: Outbound, digests: dict[str, dict[NodeId, NodeLoad]]
    ) -> dict[NodeId, KeyValue]:
        """The registrations of nodes others heard that are new here, or that registered again
        elsewhere since this replica took or announced them: revisions first (keys only), then
        those values."""
        revisions = {
            NodeId(kv.key.removeprefix(NODES_PREFIX)): kv.mod_revision
            for kv in self.client.get_prefix(NODES_PREFIX, keys_only=True)
        }
        heard = {node for digest in digests.values() for node in digest}
        # The revision each record held here came from: adopted, or announced (just now, maybe).
        held = {**outbound.adopted_revision, **self._announced_revision}
        wanted = [
            node
            for node in heard
            if node in revisions and (node not in outbound.known or held.get(node, revisions[node]) != revisions[node])
        ]
        if len(wanted) > FETCH_ONE_BY_ONE:
            everything = {NodeId(kv.key.removeprefix(NODES_PREFIX)): kv for kv in self.client.get_prefix(NODES_PREFIX)}
            return {node: everything[node] for node in wanted if node in everything}
        found = {node: self.client.get(NODES_PREFIX + node) for node in wanted}
        return {node: kv for node, kv in found.items() if kv is not None}

    async def _apply(self, snapshot: Snapshot) -> None:
        self._apply_quarantines(snapshot.quarantined)
        if self.revocations is not None and snapshot.revoked is not None:
            apply_revoked(*self.revocations, snapshot.revoked)
        heard = dict(self._orphans(snapshot))
        for digest in snapshot.heard.values():
            heard.update(digest)
        for counted, (node_id, load) in enumerate(heard.items(), start=1):
            self._count(node_id, load, snapshot.registrations.get(node_id))
            if counted % APPLY_CHUNK == 0:
                await asyncio.sleep(0)  # let heartbeats and routes in between
        self.registry.follow_epoch(snapshot.epoch)
        self._previous = snapshot
        if self.work is not None:
            for node_id, sessions in snapshot.counts:
                await self.work.take_counts(node_id, sessions)

    async def share_counts(self, node_id: NodeId, sessions: tuple[SessionTokens, ...]) -> None:
        """Publish counts a shard reported here, for the replica that routed its session."""
        if self.counts is None:
            return
        try:
            await asyncio.to_thread(self.counts.publish, node_id, sessions)
        except MeshnetError as error:  # this replica judges with them anyway; others may dispute
            logger.warning("shard counts from %s not shared with other replicas: %s", node_id, error.message)

    def _orphans(self, snapshot: Snapshot) -> dict[NodeId, NodeLoad]:
        """Nodes of replicas whose digest just disappeared (they died): heard once more now."""
        if self._previous is None:
            return {}
        gone = set(self._previous.heard) - set(snapshot.heard)
        if gone:
            logger.warning("tracker replicas %s stopped publishing: their nodes may move here", sorted(gone))
        return {node: load for replica in gone for node, load in self._previous.heard[replica].items()}

    def _count(self, node_id: NodeId, load: NodeLoad, registration: KeyValue | None) -> None:
        """Count another replica's heartbeat of ``node_id``, registering it here first if new."""
        if node_id in self.registry.quarantined:
            return
        entry = self.registry.get(node_id)
        if registration is not None and self._newer_elsewhere(node_id, entry, registration):
            # New here, or registered again at another replica (a new record): take its record.
            if not self._adopt(node_id, registration):
                return
        elif entry is None:
            return  # announced with the next exchange
        self.registry.heartbeat(node_id, load)
        entry = self.registry.get(node_id)
        if entry is not None:
            self._counted[node_id] = entry.last_seen

    def _newer_elsewhere(self, node_id: NodeId, entry: NodeEntry | None, registration: KeyValue) -> bool:
        """Whether ``registration`` is newer than the record this replica holds: none held, one
        adopted, or one it announced before that announcement was overwritten (a registration
        here since the last announcement is newer than anything in etcd)."""
        if entry is None or self._adopted.get(node_id) == entry.registered_at:
            return True
        announced_at = self._announced.get(node_id) == entry.registered_at
        return announced_at and registration.mod_revision > self._announced_revision.get(node_id, math.inf)

    def _adopt(self, node_id: NodeId, registration: KeyValue) -> bool:
        try:
            data = json.loads(registration.value)
            message = services.NodeRegistration.FromString(base64.b64decode(data["registration"]))
            record, _ = tracker_wire.registration_from_proto(message)
            reachability = data["reachability"]
            if reachability not in REACHABILITIES:
                raise ValueError(f"unknown reachability {reachability!r}")
            self.registry.register(record, node_id, reachability)
        except (MeshnetError, ValueError, KeyError, TypeError, DecodeError) as error:
            logger.warning("node %s announced by replica %s not taken: %s", node_id, registration.key, error)
            return False
        entry = self.registry.get(node_id)
        if entry is not None:
            self._adopted[node_id] = entry.registered_at
            self._adopted_revision[node_id] = registration.mod_revision
        return True

    def _apply_quarantines(self, stored: frozenset[NodeId]) -> None:
        """Apply quarantines other replicas added or cleared since the last exchange (edge-triggered,
        so a change this replica is making right now is not undone by an older read)."""
        before = frozenset() if self._previous is None else self._previous.quarantined
        for node_id in stored - before:
            self.registry.quarantine(node_id)
        for node_id in before - stored:
            self.registry.clear_quarantine(node_id)
