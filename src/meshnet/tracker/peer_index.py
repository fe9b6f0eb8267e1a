"""Which live nodes could follow a node in a route, kept as nodes come and go.

Every heartbeat's reply names the peers its node should measure (``NodeRegistry.probe_targets``):
the routable nodes of its recipe that start where it stops. Scanning the whole table for that on
every heartbeat made each heartbeat cost O(nodes), which at thousands of nodes is most of the
tracker's time; this index is updated on register and removal only, and keeps each boundary's
nodes sorted by address so a probe list is its first few entries. Owned by the registry's loop.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator

from meshnet.core.ids import NodeId
from meshnet.core.node_record import NodeRecord

Boundary = tuple[str, int]
"""A recipe's fingerprint and a layer where a node's span starts."""


class PeerIndex:
    """Routable nodes by (fingerprint, first layer), each list sorted by (address, node id)."""

    def __init__(self) -> None:
        self._starting_at: dict[Boundary, list[tuple[str, NodeId]]] = {}

    def add(self, node_id: NodeId, record: NodeRecord) -> None:
        bisect.insort(self._starting_at.setdefault(_boundary(record), []), (record.address, node_id))

    def remove(self, node_id: NodeId, record: NodeRecord) -> None:
        boundary = _boundary(record)
        peers = self._starting_at.get(boundary)
        if peers is None:
            return
        key = (record.address, node_id)
        at = bisect.bisect_left(peers, key)
        if at < len(peers) and peers[at] == key:
            del peers[at]
        if not peers:
            del self._starting_at[boundary]

    def followers(self, node_id: NodeId, record: NodeRecord, limit: int) -> tuple[str, ...]:
        """Addresses of up to ``limit`` nodes of ``record``'s recipe starting where it stops, sorted."""
        peers = self._starting_at.get((record.fingerprint, record.layers.stop), ())
        others = (address for address, peer in peers if peer != node_id)
        return tuple(itertools.islice(others, limit))

    def recipe_nodes(self, fingerprint: str) -> Iterator[NodeId]:
        """The routable nodes of one recipe, lazily: a registration's certificate check needs only
        the first (boundaries are few, so this scans no list of nodes to find it)."""
        for (recipe, _), peers in self._starting_at.items():
            if recipe == fingerprint:
                yield from (node_id for _, node_id in peers)


def _boundary(record: NodeRecord) -> Boundary:
    return (record.fingerprint, record.layers.start)
