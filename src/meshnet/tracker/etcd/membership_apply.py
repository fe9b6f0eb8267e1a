"""What another replica's digest means for this replica's registry, and what this replica's
registry gives the exchange to publish (the event-loop side of ``tracker.etcd.membership``).

No etcd here: the exchange's I/O hands over a ``Snapshot`` of what it read, and this side counts
the heartbeats other replicas heard, takes the registrations of nodes new here (or registered
again elsewhere), drops nodes deregistered at another replica, applies quarantines, and follows
the stored epoch. ``NodeRegistry`` is single-loop: everything here runs on the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from meshnet.core.errors import MeshnetError
from meshnet.core.ids import NodeId
from meshnet.core.reachability import REACHABILITIES
from meshnet.core.tracking import NodeLoad
from meshnet.tracker.etcd.client import KeyValue
from meshnet.tracker.etcd.membership_values import Announcement, Outbound, Snapshot, Written
from meshnet.tracker.node_entry import NodeEntry
from meshnet.tracker.registry import NodeRegistry
from meshnet.wire import services, tracker_wire

logger = logging.getLogger(__name__)

APPLY_CHUNK = 20
"""Nodes counted between two yields to the event loop. Each registry call still scans every
node (its sweep, and a registration's address check: ``tracker.registry``), so at 3,000 nodes
counting all at once held the loop for 0.4-1.5 s, and a mass adoption costs ~1-3 ms a node."""


def heard_loads(previous: Snapshot | None, snapshot: Snapshot) -> dict[NodeId, NodeLoad | None]:
    """Nodes other replicas heard, with the load to count (None: alive, load counted already:
    a digest read again unchanged, or a dead replica's nodes heard once more)."""
    revisions = {} if previous is None else previous.revisions
    heard: dict[NodeId, NodeLoad | None] = dict.fromkeys(orphans(previous, snapshot))
    for replica, digest in snapshot.heard.items():
        new = snapshot.revisions.get(replica) != revisions.get(replica)
        for node_id, load in digest.items():
            if new:
                heard[node_id] = load
            else:
                heard.setdefault(node_id, None)
    return heard


def orphans(previous: Snapshot | None, snapshot: Snapshot) -> dict[NodeId, NodeLoad]:
    """Nodes of replicas whose digest just disappeared (they died): heard once more now."""
    if previous is None:
        return {}
    gone = set(previous.heard) - set(snapshot.heard)
    if gone:
        logger.warning("tracker replicas %s stopped publishing: their nodes may move here", sorted(gone))
    return {node: load for replica in gone for node, load in previous.heard[replica].items()}


@dataclass
class LocalMembership:
    """This replica's registry as the exchange sees it, and what the exchange did with it."""

    registry: NodeRegistry
    interval_s: float
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
    _previous: Snapshot | None = None

    def outbound(self, revoked: frozenset[str] | None) -> Outbound:
        """What the next exchange publishes: registrations to announce, heartbeats heard here
        and what this replica holds (``revoked``: its book's ids, None if not secured)."""
        now = self.registry.now()
        since = now - self.interval_s
        announcements, heard = [], {}
        for entry in self.registry.entries():
            mine = self._adopted.get(entry.node_id) != entry.registered_at
            if mine and self._announced.get(entry.node_id) != entry.registered_at:
                registration = tracker_wire.registration_to_proto(entry.record, entry.node_id).SerializeToString()
                announcements.append(Announcement(entry.node_id, registration, entry.reachability, entry.registered_at))
            # Heard here within the last interval, and not only by this replica counting another's
            # digest (that left last_seen at the value it set).
            heard_here = entry.last_seen >= since and self._counted.get(entry.node_id) != entry.last_seen
            if heard_here:
                heard[entry.node_id] = entry.load or NodeLoad()
        known = frozenset(entry.node_id for entry in self.registry.entries())
        return Outbound(
            announcements,
            heard,
            known,
            dict(self._adopted_revision),
            dict(self._announced_revision),
            revoked,
            self._departed(known),
            self.registry.quarantined,
            now,
        )

    def _departed(self, known: frozenset[NodeId]) -> dict[NodeId, int]:
        """Drop what this replica kept of nodes no longer here; those it announced, by the
        revision it wrote them at (kept until the exchange settles their key)."""
        for table in (self._adopted, self._adopted_revision, self._counted):
            for node_id in [node for node in table if node not in known]:
                del table[node_id]
        return {node: revision for node, revision in self._announced_revision.items() if node not in known}

    def settle(self, outbound: Outbound, snapshot: Snapshot) -> None:
        """Record what the exchange wrote and apply the quarantines other replicas changed."""
        self._settle_keys(outbound, snapshot.written)
        self._apply_quarantines(snapshot.quarantined)

    async def follow(self, snapshot: Snapshot) -> None:
        """Count the heartbeats other replicas heard (taking the registrations of nodes new
        here), follow the stored epoch, and keep ``snapshot`` to compare the next one with."""
        heard = heard_loads(self._previous, snapshot)
        for counted, (node_id, load) in enumerate(heard.items(), start=1):
            self._count(node_id, load, snapshot.registrations.get(node_id))
            if counted % APPLY_CHUNK == 0:
                await asyncio.sleep(0)  # let heartbeats and routes in between
        self.registry.follow_epoch(snapshot.epoch)
        self._previous = snapshot

    def _settle_keys(self, outbound: Outbound, written: Written) -> None:
        """Record what the exchange wrote; a node held here whose key is gone is announced
        again if this replica hears it itself, else (another replica deregistered it) dropped."""
        for item in outbound.announcements:
            if item.node_id in written.announced:
                self._announced[item.node_id] = item.registered_at
                self._announced_revision[item.node_id] = written.announced[item.node_id]
        for node_id in written.settled:  # a node back here since is announced again
            self._announced.pop(node_id, None)
            self._announced_revision.pop(node_id, None)
        for node_id in outbound.known:
            if node_id in written.keys or node_id in written.announced or node_id in outbound.quarantined:
                continue
            entry = self.registry.get(node_id)
            if entry is None:
                continue
            if node_id in outbound.heard:
                self._adopted.pop(node_id, None)
                self._adopted_revision.pop(node_id, None)
                self._announced.pop(node_id, None)  # announced (as this replica's) next exchange
            elif self._adopted.get(node_id) == entry.registered_at:
                logger.info("node %s left at another replica (its registration was withdrawn)", node_id)
                self.registry.deregister(node_id)

    def _count(self, node_id: NodeId, load: NodeLoad | None, registration: KeyValue | None) -> None:
        """Count another replica's heartbeat of ``node_id``, registering it here first if new
        (``load`` None: only its window starts again)."""
        if node_id in self.registry.quarantined:
            return
        entry = self.registry.get(node_id)
        if registration is not None and self._newer_elsewhere(node_id, entry, registration):
            # New here, or registered again at another replica (a new record): take its record.
            if not self._adopt(node_id, registration):
                return
        elif entry is None:
            return  # announced with the next exchange
        if load is None:
            self.registry.heard(node_id)
            return
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
