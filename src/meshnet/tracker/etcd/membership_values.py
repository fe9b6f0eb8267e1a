"""The values one membership exchange (``tracker.etcd.membership``) passes between its event-loop
side and its etcd I/O, and the codec of a digest (``heard/<replica>``).

``Outbound`` is read from the registry on the event loop, ``Snapshot`` is what the I/O thread
read and wrote in etcd, ``Written`` is the part of it this replica relies on afterwards.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field, replace

from google.protobuf.message import DecodeError

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId
from meshnet.core.reachability import Reachability
from meshnet.core.tracking import NodeLoad
from meshnet.tracker.etcd.client import KeyValue
from meshnet.tracker.etcd.counts import Counts
from meshnet.wire import services, tracker_wire


@dataclass(frozen=True)
class Announcement:
    """A node registered at this replica, as ``nodes/<id>`` carries it."""

    node_id: NodeId
    registration: bytes
    """``NodeRegistration`` protobuf: the wire's own validated codec for a record."""
    reachability: Reachability
    registered_at: float
    """The registry's registered_at of the record announced (not written: this replica's own)."""

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
    announced_revision: dict[NodeId, int]
    revoked: frozenset[str] | None
    """Ids this replica's book revoked (None: not a secured tracker)."""
    departed: dict[NodeId, int]
    """Nodes this replica announced that left it, by the revision of its announcement: their
    keys are withdrawn once no replica hears them."""
    quarantined: frozenset[NodeId]
    now: float


@dataclass(frozen=True)
class Written:
    """What one exchange did write (a failed exchange wrote nothing this replica relies on)."""

    announced: dict[NodeId, int] = field(default_factory=dict)
    """Announcements written, by the revision they were written at."""
    settled: frozenset[NodeId] = frozenset()
    """Departed nodes whose key is gone: withdrawn now, or rewritten by another replica."""
    keys: dict[NodeId, int] = field(default_factory=dict)
    """Every ``nodes/<id>`` key after the writes, by mod_revision."""


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
    counts_through: int = 0
    """The revision those counts were read through: committed once every one was taken."""
    revoked: frozenset[str] | None = None
    """Every id revoked at any replica (None: not a secured tracker)."""
    written: Written = field(default_factory=Written)
    revisions: dict[str, int] = field(default_factory=dict)
    """Each digest's mod_revision: a digest read again unchanged proves its nodes alive, but its
    loads were counted already (counting them again would reset routes' burst protection)."""


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
