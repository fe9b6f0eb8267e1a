"""One node of an expert-parallel group: its backend, its row exchange, its place in the group.

The node loads the whole model as node ``I`` (routed experts ``e mod N == I`` computed here),
opens a row stream to every lower-indexed peer and accepts one from every higher one. A driver
then runs every batch on every node (``step``); the nodes swap slot rows inside the step. A lost
peer fails the step on every node at once, and this node refuses further steps: a group is
re-formed by restarting it.

Concurrency: one event loop (the process's main thread) owns every gRPC call, the links and the
group state; the engine runs on one thread of its own and reaches the loop only through the row
exchange (``links.GrpcRowExchange``). So admitting a row stream and leaving the group are
ordered by the loop itself (a stream is either cut or refused), and a liveness probe is answered
while the engine computes.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

import grpc.aio

from meshnet.artifact.cache import SliceCache
from meshnet.core.errors import FailedPrecondition, InvalidArgument, MeshnetError, Unauthenticated, Unavailable
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import StepInput
from meshnet.moe import wire as expert_wire
from meshnet.moe.backend import ExpertParallelBackend
from meshnet.moe.config import ExpertNodeConfig
from meshnet.moe.links import GrpcRowExchange, PeerLink, open_link
from meshnet.moe.ownership import ExchangeGeometry
from meshnet.moe.shape import read_moe_shape
from meshnet.relay.dial import dial
from meshnet.wire.tls import LinkSecurity, hop_server_name

log = logging.getLogger(__name__)


class ExpertNode:
    """The node's state: its backend, its row exchange, the step sequence it has run.

    Built and used on the node's event loop; only the backend runs on the engine thread."""

    def __init__(self, config: ExpertNodeConfig, security: LinkSecurity | None = None) -> None:
        self.ownership = config.ownership
        self.config = config
        self.security = security
        """None only with ``--insecure`` (loopback development): then nobody is checked."""
        self.peers = config.peers
        self._loop = asyncio.get_running_loop()
        cache = SliceCache(config.data_dir / "cache")
        self.model_sha256 = cache.source_sha256(config.model)
        moe = read_moe_shape(config.model)
        path = cache.shard_files(config.model, LayerRange(0, moe.n_layers), moe.n_layers).slice
        geometry = ExchangeGeometry(moe.n_embd, moe.n_expert, moe.n_expert_used, moe.n_layers, self.ownership.count)
        self.exchange = GrpcRowExchange(self.ownership, geometry, config.exchange_timeout_s, self._loop)
        self.backend = ExpertParallelBackend(
            path, config.llama, self.ownership, self.exchange, expert_cache_bytes=config.expert_cache_bytes
        )
        self._engine = ThreadPoolExecutor(max_workers=1, thread_name_prefix="expert-engine")
        self._channels: list[grpc.aio.Channel] = []
        self._next_step = 0
        self._members = {i: p.node_id for i, p in enumerate(self.peers) if p.node_id and i != self.ownership.index}
        """Node ids of the group's other members: as listed, or as their row stream's certificate says."""
        self._left: MeshnetError | None = None
        """Why this node left its group (a member was revoked); every later step fails with it."""

    def describe(self) -> expert_wire.ExpertNodeDescription:
        shape, moe = self.backend.shape, self.backend.moe
        return expert_wire.ExpertNodeDescription(
            self.ownership.index,
            self.ownership.count,
            self.model_sha256,
            shape.n_vocab,
            moe.n_expert,
            moe.n_expert_used,
            shape.max_slots,
            shape.n_ctx_per_slot,
            self.exchange.connected,
            shape.n_layers,
            shape.n_embd,
            self.exchange.exchanges,
            *self.exchange.latency_us(),
            self.exchange.frame_bytes_sent,
            self.backend.released_expert_bytes,
            self._next_step,
            *_cache_figures(self.backend),
            numerics=self.config.numerics,
        )

    async def step(self, request: expert_wire.ExpertStepRequest) -> expert_wire.ExpertStepReply:
        if self._left is not None:
            raise self._left
        if self.exchange.connected != self.ownership.count - 1:
            # Named, so the driver's error says which node of the group went (the peer may be
            # found lost here, between two steps, before the driver's own call to it fails).
            missing = self.exchange.missing() or "a peer was lost"
            raise Unavailable(
                f"expert node {self.ownership.label}: not every peer of the group is connected: {missing}"
            )
        if request.step != self._next_step:
            raise FailedPrecondition(f"step {request.step} out of order: this node expects step {self._next_step}")
        shape = self.backend.shape
        items = expert_wire.step_from_proto(request, shape.max_slots, shape.n_ctx_per_slot)
        batch = [StepInput(i.slot, i.position, tokens=i.tokens, want_logits=i.want_logits) for i in items]
        self._next_step += 1
        return await self._loop.run_in_executor(self._engine, self._run, request.step, batch)

    def _run(self, step: int, batch: list[StepInput]) -> expert_wire.ExpertStepReply:
        """The step on the engine thread; the reply is encoded there too, off the event loop."""
        outputs = self.backend.run(batch)
        return expert_wire.outputs_to_proto(step, [(o.slot, o.logits) for o in outputs])  # type: ignore[misc]

    async def release(self, slot: int) -> None:
        if slot >= self.backend.shape.max_slots:
            raise InvalidArgument(f"slot {slot} is out of range")
        await self._loop.run_in_executor(self._engine, self.backend.truncate, slot, 0)

    def admit_link(self, link: PeerLink, node_id: str | None) -> MeshnetError | None:
        """Take member ``link.peer``'s row stream (``node_id``: its certificate's, for revocation
        checks); the reason if it is refused."""
        if self._left is not None:
            return self._left
        if not self.exchange.add(link):
            return FailedPrecondition(f"node {link.peer} already has a row stream to this node")
        if node_id is not None:
            self._members[link.peer] = node_id
        return None

    def on_revoked(self, revoked: frozenset[str]) -> None:
        """Adopt the tracker's list (from any thread); if it names a member, leave the group for good.

        Admission alone would not do: the row streams were admitted when the group formed and
        carry every token's hidden state for as long as they stay up. Closing them fails the
        group on every node at once (as a lost peer does), so a revoked node sees nothing more."""
        if self.security is not None:
            self.security.revocations.replace(revoked)  # new handshakes and streams check it at once
        self._loop.call_soon_threadsafe(self._leave_if_named, revoked)

    def _leave_if_named(self, revoked: frozenset[str]) -> None:
        named = sorted(node_id for node_id in self._members.values() if node_id in revoked)
        if not named or self._left is not None:
            return
        self._left = Unauthenticated(f"expert group member(s) {', '.join(named)} revoked: this node left the group")
        log.warning("expert node %s leaves its group: %s", self.ownership.label, self._left.message)
        self.exchange.close()

    async def form_group(self, timeout_s: float) -> None:
        """Open the row streams to the lower-indexed peers and wait for the higher ones' streams."""
        deadline = self._loop.time() + timeout_s
        for peer in range(self.ownership.index):
            await self._dial(peer, deadline)
        try:
            await asyncio.wait_for(self.exchange.complete.wait(), max(deadline - self._loop.time(), 0.1))
        except TimeoutError:
            raise Unavailable(
                f"expert node {self.ownership.label}: the group did not form in {timeout_s:g} s"
            ) from None

    async def _dial(self, peer: int, deadline: float) -> None:
        """Open the row stream to node ``peer`` (it accepts it).

        Pinned to the listed node's own name, or to the name every worker certificate carries
        when the peer is listed by address only (a gateway's certificate fails either way)."""
        listed = self.peers[peer]
        server_name = hop_server_name(listed.node_id)
        channel = dial(listed.address, self.security, server_name, expert_wire.CHANNEL_OPTIONS)
        self._channels.append(channel)
        try:
            await asyncio.wait_for(channel.channel_ready(), max(deadline - self._loop.time(), 0.1))
        except TimeoutError:
            what = f"an mTLS handshake as {server_name}" if self.security else "a plaintext connection"
            raise Unavailable(f"expert peer {peer} ({listed}) did not complete {what} in time") from None
        self.exchange.add(await open_link(channel, self.ownership.index, peer, self.model_sha256))

    async def close(self) -> None:
        """End the links first (a step waiting on them fails at once), then the engine, then the model."""
        self.exchange.close()
        await asyncio.to_thread(self._engine.shutdown, wait=True)
        for channel in self._channels:
            await channel.close()
        self.backend.close()


def _cache_figures(backend: ExpertParallelBackend) -> tuple[int, int, int, int]:
    """Capacity, hits, misses and bytes read of the node's expert cache (zeros without one)."""
    cache, counters = backend.expert_cache_capacity, backend.expert_cache
    if counters is None:
        return 0, 0, 0, 0
    return cache, counters.hits, counters.misses, counters.bytes_read
