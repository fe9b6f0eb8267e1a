"""The one peer a shard copies its KV snapshots to: a live worker of the same recipe and layers.

A route that replaces this shard after it is lost runs its layers on another node, which can
resume the session only from a snapshot it holds: so each snapshot also goes to one peer serving
exactly this recipe and range (the one with the smallest node id, so a range's copies gather
where a failover will find them). The peer is looked up in the tracker's node table, refreshed
by the worker's membership tasks; the copy travels as the file itself, in pieces, over the
swarm's mTLS links (``KeepSnapshot``, workers only), and the peer checks it is of its own recipe
and range before it keeps it. Nothing of a snapshot ever goes to the tracker.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc

from meshnet.core.ids import NodeId
from meshnet.core.layers import LayerRange
from meshnet.core.swarm_status import NodeTable, node_health
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire import services
from meshnet.wire.status import error_from_rpc

log = logging.getLogger(__name__)

PIECE_BYTES = 1 << 20
"""Each message of a copy: well within any frame limit a peer's channel has."""
COPY_TIMEOUT_S = 60.0


class SnapshotPeers:
    """Where this shard's snapshots are copied (nowhere until the node table names a peer)."""

    def __init__(self, links: ChannelPool, own: NodeId, fingerprint: str, layers: LayerRange) -> None:
        self._links = links
        self._own = own
        self._fingerprint = fingerprint
        self._layers = layers
        self.peer: tuple[str, NodeId] | None = None
        """(address, node id) of the peer, or None."""
        self.copies_sent = 0

    def update(self, table: NodeTable) -> None:
        """Choose the peer from the tracker's node table: live, this recipe, these layers, and
        dialable (a private node behind NAT with no relay is listed but reachable by nobody)."""
        peers = sorted(
            (node.node_id, node.record.address)
            for node in table.nodes
            if node.node_id != self._own
            and node.routable
            and node.record.fingerprint == self._fingerprint
            and node.record.layers == self._layers
            and node_health(node, table.heartbeat_interval_s) == "healthy"
        )
        self.peer = None if not peers else (peers[0][1], NodeId(peers[0][0]))

    async def send(self, data: bytes) -> bool:
        """Copy one snapshot file to the peer; False when there is none or it did not keep it."""
        peer = self.peer
        if peer is None:
            return False
        address, node_id = peer
        try:
            reply = await self._links.stub(address, node_id).KeepSnapshot(_pieces(data), timeout=COPY_TIMEOUT_S)
        except grpc.RpcError as rpc_error:
            log.info("snapshot not copied to %s: %s", address, error_from_rpc(rpc_error).message)
            return False
        self.copies_sent += int(reply.kept)
        return bool(reply.kept)


async def _pieces(data: bytes) -> AsyncIterator[services.SnapshotPiece]:
    for start in range(0, len(data), PIECE_BYTES):
        yield services.SnapshotPiece(data=data[start : start + PIECE_BYTES])
