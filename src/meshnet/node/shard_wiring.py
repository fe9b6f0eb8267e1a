"""A worker's shard, put together and connected to its peers: the one place that decides what a
shard sends over and how it is built.

``WorkerLinks`` owns everything a worker sends to its peers over: the channels of its sessions'
own Session streams, the ring batch streams over those channels (``route.ring_batch``: decode
rows per next hop, the tail's answers per head), and the count of what they send (``SeamCount``,
in the worker's metrics). ``build_shard`` chooses a shard's stages from its backend's role and
hands a forwarding one those senders; ``worker_shard`` does it from a worker's config, with the
worker's tickets, prompt reuse store and snapshot places. ``assembly`` calls it once, in its
start-up order; ``serve_worker`` closes the links once the server has stopped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from meshnet.core.ids import NodeId
from meshnet.core.node_record import NodeRecord
from meshnet.engine.constraints import GrammarVocabulary
from meshnet.node.config import WorkerConfig
from meshnet.node.forward_stage import Connect, Downstream, ForwardStage, RowSender
from meshnet.node.kv_reuse import KvReuse
from meshnet.node.kv_snapshots import KvSnapshots, SnapshotSettings
from meshnet.node.ring import OpenRing, TailState
from meshnet.node.shard import AnyShard, Shard
from meshnet.node.snapshot_peers import SnapshotPeers
from meshnet.node.stages import Continuation, HeadDecodeLoop, NoContinuation, SampleStage
from meshnet.node.tickets import TicketGate
from meshnet.route.coalescer import SeamCount
from meshnet.route.ring_batch import RingLinks
from meshnet.route.shard_stream import ChannelPool, ShardStream
from meshnet.security.tickets import TicketVerifier
from meshnet.session.admission import AdmissionPolicy, CapacityPlan
from meshnet.session.engine_loop import EngineLoop
from meshnet.session.kv_store import KvStore
from meshnet.session.snapshot_disk import SnapshotDisk
from meshnet.session.table import SessionTable
from meshnet.wire.tls import LinkSecurity


@dataclass(frozen=True)
class WorkerLinks:
    """What one worker sends to its peers over (one per worker, shared by every session)."""

    pool: ChannelPool
    """Channels to the peers: each session's Session stream, snapshot copies, ring batches."""
    rings: RingLinks
    """The ring batch streams over ``pool``'s channels: rows per next hop, answers per tail."""
    seams: SeamCount
    """Messages and session rows sent across the worker's seams, on either kind of stream."""

    @classmethod
    def open(cls, max_frame_bytes: int, security: LinkSecurity | None) -> WorkerLinks:
        pool = ChannelPool(max_frame_bytes, security)
        seams = SeamCount()
        return cls(pool, RingLinks(pool, seams), seams)

    def connect(self, address: str, timeout: float | None, node_id: str | None) -> ShardStream:
        """Open a session's Session stream to its next hop (``forward_stage.Connect``)."""
        return ShardStream(self.pool, address, timeout, node_id)

    async def close(self) -> None:
        await self.rings.close()  # before the channels they run over
        await self.pool.close()


def worker_shard(
    config: WorkerConfig,
    node: tuple[NodeId, NodeRecord],
    loop: EngineLoop,
    capacity: CapacityPlan,
    links: WorkerLinks,
    security: LinkSecurity | None,
    grammars: GrammarVocabulary | None,
    snapshots: SnapshotSettings,
) -> AnyShard:
    """The shard over ``loop``'s engine: admission, ``links`` to the next hops, tickets, reuse
    store and where its snapshots go."""
    node_id, record = node
    return build_shard(
        node_id,
        record,
        loop,
        config.admission_policy(capacity.max_sessions),
        capacity,
        links.connect,
        open_ring=links.rings.open_ring,
        tickets=ticket_gate(security),
        kv_store=KvStore(capacity.prefix_cache_bytes),
        snapshots=snapshots,
        grammars=grammars,
        rows=links.rings,
        seams=links.seams,
    )


async def snapshot_settings(
    config: WorkerConfig, node_id: NodeId, links: WorkerLinks, record: NodeRecord
) -> SnapshotSettings:
    """Where the worker's KV snapshots go: its own folder of the data dir, and one peer."""
    disk = await asyncio.to_thread(SnapshotDisk, config.snapshot_directory(node_id), config.snapshot_bytes)
    peers = SnapshotPeers(links.pool, node_id, record.fingerprint, record.layers)
    return SnapshotSettings(disk, config.snapshot_every, peers)


def ticket_gate(security: LinkSecurity | None) -> TicketGate:
    """What checks the route tickets of this worker's sessions: signed by a tracker of the swarm's
    CA when secured; unsigned tickets on an unsecured (loopback) worker."""
    if security is None:
        return TicketGate(None)
    return TicketGate(TicketVerifier(security.node.ca_pem, security.clock), security.clock)


def build_shard(
    node_id: NodeId,
    record: NodeRecord,
    loop: EngineLoop,
    policy: AdmissionPolicy,
    capacity: CapacityPlan,
    connect: Connect,
    *,
    open_ring: OpenRing,
    tickets: TicketGate,
    kv_store: KvStore,
    snapshots: SnapshotSettings | None = None,
    clock: Callable[[], float] = time.monotonic,
    grammars: GrammarVocabulary | None = None,
    rows: RowSender | None = None,
    seams: SeamCount | None = None,
) -> AnyShard:
    """The shard for the backend ``loop`` runs, its stages chosen from the backend's role.

    ``connect`` opens the stream to a session's next hop and ``open_ring`` the tail's RingReturn
    stream of a session (used only if this shard forwards; ``open_ring`` only by a head, which
    reads the tail's answers to every frame after the opening one there); ``clock`` times
    sessions for eviction and expiry; ``grammars`` lets a tail constrain output to a grammar
    (response_format), None refuses such sessions; ``tickets`` checks every opening frame's
    route ticket (``node.tickets``); ``snapshots`` where and how often it snapshots sessions
    (``node.kv_snapshots``; none: never); ``rows`` batches the decode frames a forwarding shard
    sends per next hop (``route.ring_batch``; none: each on its session's own stream), and
    ``seams`` counts what the worker sends across seams (shared with ``rows``).
    """
    seams = SeamCount() if seams is None else seams
    shape = loop.backend.shape
    continuation: Continuation = HeadDecodeLoop() if shape.takes_tokens else NoContinuation()
    kept = KvSnapshots.of(snapshots, loop, record.fingerprint)
    kv = KvReuse(kv_store, loop, kept, takes_tokens=shape.takes_tokens)
    if shape.emits_logits:
        sampling_table = SessionTable[TailState](policy, clock=clock)
        stage = SampleStage(grammars, is_head=shape.takes_tokens)
        return Shard(node_id, record, loop, sampling_table, capacity, stage, continuation, tickets, kv, seams)
    head_ring = open_ring if shape.takes_tokens else None
    forward = ForwardStage(shape.n_layers, connect, open_ring=head_ring, rows=rows, seams=seams)
    table = SessionTable[Downstream](policy, clock=clock)
    return Shard(node_id, record, loop, table, capacity, forward, continuation, tickets, kv, seams)
