"""``meshnet worker --experts I/N --expert-peers A0,...,AN-1``: one node of an expert-parallel group.

Start-up: certify the mechanism on a tiny MoE of the served family and types (refuse to serve
otherwise), load the whole model as node ``I`` (routed experts ``e mod N == I`` computed here),
listen, open a row stream to every lower-indexed peer and accept one from every higher one;
the ready line is printed once all N-1 streams are up. A driver then runs every batch on every
node (``ExpertStep``); the nodes swap slot rows inside the step. A lost peer fails the step on
every node at once, and this node refuses further steps: a group is re-formed by restarting it.

Links are mutual TLS from the swarm CA, like every other meshnet link (``--identity``; plaintext
only with ``--insecure`` on loopback): a node dials each peer pinned to the name only that peer's
certificate carries (``NODE_ID@HOST:PORT``) or, listed by address only, that every worker's
carries; it admits each RPC by the caller's role and, for a row stream, by the node id listed for
the index it claims (``security.policy.authorize_expert``). With ``--tracker`` a node also takes
the swarm's revocation list (``expert_watch.py``) and renews its certificate; a list naming a
member of its group makes it leave the group (below, ``ExpertNode.on_revoked``).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import NoReturn

import grpc

from meshnet.artifact.cache import SliceCache
from meshnet.core.errors import FailedPrecondition, InvalidArgument, MeshnetError, Unauthenticated, Unavailable
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import StepInput
from meshnet.moe import wire as expert_wire
from meshnet.moe.backend import ExpertParallelBackend
from meshnet.moe.certification import certify_expert_parallel
from meshnet.moe.config import ExpertNodeSettings
from meshnet.moe.links import ExpertPeer, GrpcRowExchange, PeerLink
from meshnet.moe.ownership import ExchangeGeometry, ExpertNumerics, ExpertOwnership
from meshnet.moe.shape import read_moe_shape
from meshnet.moe.watch import watch_tracker
from meshnet.security.policy import ExpertRpc, authorize_expert
from meshnet.wire.status import error_metadata, status_for
from meshnet.wire.tls import LinkSecurity, bind, blocking_channel, enforce, hop_server_name

log = logging.getLogger(__name__)
STARTUP_TIMEOUT_S = 120.0
_CHANNEL_OPTIONS = expert_wire.CHANNEL_OPTIONS


class ExpertNode:
    """The node's state: its backend, its row exchange, the step sequence it has run."""

    def __init__(
        self, config: ExpertNodeSettings, ownership: ExpertOwnership, security: LinkSecurity | None = None
    ) -> None:
        if len(config.expert_peers) != ownership.count:
            raise InvalidArgument(f"--expert-peers must list all {ownership.count} nodes' addresses in index order")
        if config.model is None:
            raise InvalidArgument("an expert node needs --model")
        self.ownership = ownership
        self.config = config
        self.security = security
        """None only with ``--insecure`` (loopback development): then nobody is checked."""
        self.peers = [ExpertPeer.parse(entry) for entry in config.expert_peers]
        cache = SliceCache(config.data_dir / "cache")
        self.model_sha256 = cache.source_sha256(config.model)
        moe = read_moe_shape(config.model)
        path = cache.shard_files(config.model, LayerRange(0, moe.n_layers), moe.n_layers).slice
        geometry = ExchangeGeometry(moe.n_embd, moe.n_expert, moe.n_expert_used, moe.n_layers, ownership.count)
        self.exchange = GrpcRowExchange(ownership, geometry, config.expert_timeout)
        llama = config.llama_config(config.max_sessions)
        cache_bytes = None if config.expert_cache_mb is None else int(config.expert_cache_mb * 1e6)
        self.backend = ExpertParallelBackend(path, llama, ownership, self.exchange, expert_cache_bytes=cache_bytes)
        self._engine = ThreadPoolExecutor(max_workers=1, thread_name_prefix="expert-engine")
        self._next_step = 0
        self._members = {i: p.node_id for i, p in enumerate(self.peers) if p.node_id and i != ownership.index}
        """Node ids of the group's other members: as listed, or as their row stream's certificate says."""
        self._left: MeshnetError | None = None
        """Why this node left its group (a member was revoked); every later step fails with it."""
        self._membership = threading.Lock()
        """Orders admitting a row stream against leaving: a stream is either cut or refused."""

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
            numerics=ExpertNumerics(self.config.prefill_chunk, self.config.flash_attn, self.config.repack),
        )

    def step(self, request: expert_wire.ExpertStepRequest) -> expert_wire.ExpertStepReply:
        if self._left is not None:
            raise self._left
        if self.exchange.connected != self.ownership.count - 1:
            raise Unavailable(f"expert node {self.ownership.label}: not every peer of the group is connected")
        if request.step != self._next_step:
            raise FailedPrecondition(f"step {request.step} out of order: this node expects step {self._next_step}")
        shape = self.backend.shape
        items = expert_wire.step_from_proto(request, shape.max_slots, shape.n_ctx_per_slot)
        batch = [StepInput(i.slot, i.position, tokens=i.tokens, want_logits=i.want_logits) for i in items]
        self._next_step += 1
        outputs = self._engine.submit(self.backend.run, batch).result()
        return expert_wire.outputs_to_proto(request.step, [(o.slot, o.logits) for o in outputs])  # type: ignore[misc]

    def admit_link(self, link: PeerLink, node_id: str | None) -> MeshnetError | None:
        """Take member ``link.peer``'s row stream (``node_id``: its certificate's, for revocation
        checks); the reason if it is refused."""
        with self._membership:
            if self._left is not None:
                return self._left
            if not self.exchange.add(link):
                return FailedPrecondition(f"node {link.peer} already has a row stream to this node")
            if node_id is not None:
                self._members[link.peer] = node_id
            return None

    def on_revoked(self, revoked: frozenset[str]) -> None:
        """Adopt the tracker's list; if it names a member, leave the group for good.

        Admission alone would not do: the row streams were admitted when the group formed and
        carry every token's hidden state for as long as they stay up. Closing them fails the
        group on every node at once (as a lost peer does), so a revoked node sees nothing more."""
        if self.security is not None:
            self.security.revocations.replace(revoked)
        with self._membership:
            named = sorted(node_id for node_id in self._members.values() if node_id in revoked)
            if not named or self._left is not None:
                return
            self._left = Unauthenticated(f"expert group member(s) {', '.join(named)} revoked: this node left the group")
        self.exchange.abort(self._left)

    def release(self, slot: int) -> None:
        if slot >= self.backend.shape.max_slots:
            raise InvalidArgument(f"slot {slot} is out of range")
        self._engine.submit(self.backend.truncate, slot, 0).result()

    def dial_lower_peers(self, deadline: float) -> None:
        """Open the row stream to every node with a lower index (they accept it).

        Pinned to the listed node's own name, or to the name every worker certificate carries
        when the peer is listed by address only (a gateway's certificate fails either way)."""
        for peer in range(self.ownership.index):
            listed = self.peers[peer]
            server_name = hop_server_name(listed.node_id)
            channel = blocking_channel(listed.address, self.security, server_name, _CHANNEL_OPTIONS)
            try:
                grpc.channel_ready_future(channel).result(timeout=max(deadline - time.monotonic(), 0.1))
            except grpc.FutureTimeoutError:
                what = f"an mTLS handshake as {server_name}" if self.security else "a plaintext connection"
                raise Unavailable(f"expert peer {peer} ({listed}) did not complete {what} in time") from None
            link = PeerLink(self.ownership.index, peer)
            opening = expert_wire.ExpertRowsFrame(sender=self.ownership.index, model_sha256=self.model_sha256)
            responses = expert_wire.ExpertGroupStub(channel).ExchangeRows(link.outgoing(opening))
            link.cancel_with(responses.cancel)
            self.exchange.add(link)
            threading.Thread(target=link.pump, args=(responses,), daemon=True, name=f"rows-from-{peer}").start()

    def close(self) -> None:
        self.exchange.close()
        self._engine.shutdown(wait=True)
        self.backend.close()


class ExpertNodeServicer(expert_wire.ExpertGroupServicer):
    def __init__(self, node: ExpertNode) -> None:
        self._node = node

    def _admit(self, context: grpc.ServicerContext, rpc: ExpertRpc, listed_node_id: str | None = None) -> str | None:
        """The caller's node id if its certificate may call ``rpc``, else abort the call (None: insecure)."""
        security = self._node.security
        if security is None:
            return None
        try:
            caller = security.peer(context)
            revoked = security.revocations.current()
            enforce(authorize_expert(caller, rpc, revoked=revoked, listed_node_id=listed_node_id))
        except MeshnetError as error:
            _abort(context, error)
        return caller.node_id

    def ExchangeRows(
        self, request_iterator: Iterator[expert_wire.ExpertRowsFrame], context: grpc.ServicerContext
    ) -> Iterator[expert_wire.ExpertRowsFrame]:
        caller = self._admit(context, "ExchangeRows")
        node = self._node
        opening = next(request_iterator, None)
        if opening is None:
            return
        peer = opening.sender
        if not node.ownership.index < peer < node.ownership.count or opening.model_sha256 != node.model_sha256:
            _abort(context, InvalidArgument(f"row stream from node {peer} of another group or model refused"))
        if node.peers[peer].node_id is not None:
            self._admit(context, "ExchangeRows", node.peers[peer].node_id)
        link = PeerLink(node.ownership.index, peer)
        refused = node.admit_link(link, caller)
        if refused is not None:
            _abort(context, refused)
        context.add_callback(link.close)
        threading.Thread(target=link.pump, args=(request_iterator,), daemon=True, name=f"rows-from-{peer}").start()
        yield from link.outgoing()

    def ExpertStep(
        self, request: expert_wire.ExpertStepRequest, context: grpc.ServicerContext
    ) -> expert_wire.ExpertStepReply:
        self._admit(context, "ExpertStep")
        try:
            return self._node.step(request)
        except MeshnetError as error:
            _abort(context, error)

    def ExpertRelease(
        self, request: expert_wire.ExpertReleaseRequest, context: grpc.ServicerContext
    ) -> expert_wire.ExpertReleaseReply:
        self._admit(context, "ExpertRelease")
        try:
            self._node.release(request.slot)
        except MeshnetError as error:
            _abort(context, error)
        return expert_wire.ExpertReleaseReply()

    def DescribeExpertNode(
        self, request: expert_wire.ExpertNodeQuery, context: grpc.ServicerContext
    ) -> expert_wire.ExpertNodeInfo:
        self._admit(context, "DescribeExpertNode")
        return expert_wire.node_info_to_proto(self._node.describe())


def _abort(context: grpc.ServicerContext, error: MeshnetError) -> NoReturn:
    context.set_trailing_metadata(error_metadata(error))
    context.abort(status_for(error), error.message)
    raise error  # context.abort always raises; this keeps the NoReturn promise


def serve_expert_node(
    config: ExpertNodeSettings, on_ready: Callable[[str, str], None], security: LinkSecurity | None = None
) -> None:
    """Certify, load, listen, connect the group, call ``on_ready(address, checks)``, serve until SIGTERM.

    ``security``: this node's identity; None serves plaintext (``--insecure``, loopback only)."""
    ownership = config.experts
    if ownership is None:
        raise InvalidArgument("an expert node needs --experts I/N")
    checks = certify_expert_parallel(config.model, ownership.count, config.llama_config(1))  # type: ignore[arg-type]
    node = ExpertNode(config, ownership, security)
    server = grpc.server(ThreadPoolExecutor(max_workers=ownership.count + 8), options=_CHANNEL_OPTIONS)
    expert_wire.add_expert_group_servicer(ExpertNodeServicer(node), server)
    bound = bind(server, f"{config.host}:{config.port}", security)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server.start()
    watch = None
    if config.tracker and security is not None:
        watch = watch_tracker(config.tracker, security, node.on_revoked, stop)
    elif config.tracker:
        log.warning("--tracker is ignored with --insecure: there are no certificates to revoke or renew")
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        node.dial_lower_peers(deadline)
        if not node.exchange.complete.wait(max(deadline - time.monotonic(), 0.1)):
            raise Unavailable(f"expert node {ownership.label}: the group did not form in {STARTUP_TIMEOUT_S:g} s")
        on_ready(f"{config.host}:{bound}", f"{len(checks)} certification checks")
        stop.wait()
    finally:
        stop.set()  # ends the tracker watch too
        if watch is not None:
            watch.join(timeout=5.0)
        server.stop(grace=1.0).wait()
        node.close()


def _cache_figures(backend: ExpertParallelBackend) -> tuple[int, int, int, int]:
    """Capacity, hits, misses and bytes read of the node's expert cache (zeros without one)."""
    cache, counters = backend.expert_cache_capacity, backend.expert_cache
    if counters is None:
        return 0, 0, 0, 0
    return cache, counters.hits, counters.misses, counters.bytes_read
