"""Where a shard copies its snapshots (``node.snapshot_peers``): a live, dialable twin of it."""

from __future__ import annotations

from meshnet.core.ids import NodeId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import Certification, HardwareSummary, NodeCapability, NodeRecord
from meshnet.core.reachability import Reachability
from meshnet.core.recipe import Recipe
from meshnet.core.swarm_status import NodeStatus, NodeTable
from meshnet.core.tracking import NodeLoad
from meshnet.node.snapshot_peers import SnapshotPeers
from meshnet.route.shard_stream import ChannelPool

RECIPE = Recipe("f1".ljust(64, "0"), "llama", "1", "Q8_0", "f32", "f16", "llama.cpp", "0.3.36", 6, 8)


def node(node_id: str, address: str, reachability: Reachability = "public") -> NodeStatus:
    record = NodeRecord(
        address=address,
        recipe=RECIPE,
        fingerprint=RECIPE.fingerprint(),
        model="tiny",
        quantization="Q8_0",
        layers=LayerRange(2, 4),
        hardware=HardwareSummary(cpu_count=2, memory_bytes=1 << 30),
        capability=NodeCapability(256, 64, 256, 4 << 20, 8, 8),
        certification=Certification.seal(RECIPE.fingerprint(), "0.3.36", ("bit-identical",), "ab" * 32, "ab" * 32),
    )
    return NodeStatus(node_id, record, NodeLoad(free_sessions=8), 0.1, reachability=reachability)


def test_a_private_twin_behind_nat_is_never_the_snapshot_peer_and_a_relayed_one_may_be() -> None:
    peers = SnapshotPeers(ChannelPool(1 << 20), NodeId("w-me"), RECIPE.fingerprint(), LayerRange(2, 4))
    hidden = node("w-a", "10.0.0.7:7000", "private")
    peers.update(NodeTable((node("w-me", "10.0.0.1:7000"), hidden), 3, 1.0, 3.0))
    assert peers.peer is None
    relayed = node("w-b", "w-b@relay.example:7090", "relayed")
    peers.update(NodeTable((node("w-me", "10.0.0.1:7000"), hidden, relayed), 3, 1.0, 3.0))
    assert peers.peer == ("w-b@relay.example:7090", "w-b")
