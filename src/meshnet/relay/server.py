"""The relay server: pairs each Dial with the Splice its node opens, and copies bytes between them.

Who may do what, from the outer mTLS certificate (``LinkSecurity.peer``: the swarm CA, not
revoked): Attach and Splice only a worker, as the node id its certificate carries; Dial any swarm
member. The relay never holds a key of the inner session: it forwards each message after a
stream's first as it came (``wire.relay_wire``), counting it against the node's bounds
(``relay.bounds``) and, with ``capture_dir``, writing the data it carried to a file per
connection and direction (tests read those to prove only TLS records cross).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import grpc
import grpc.aio

from meshnet.core.errors import MeshnetError, PermissionDenied, ResourceExhausted, Unauthenticated, Unavailable
from meshnet.core.ids import NodeId
from meshnet.relay.bounds import ByteBudget, RelayBounds, admit_attach, admit_connection
from meshnet.security.identity import PeerIdentity, Role
from meshnet.wire import relay_wire
from meshnet.wire.status import abort_with
from meshnet.wire.tls import LinkSecurity

logger = logging.getLogger(__name__)

SPLICE_TIMEOUT_S = 2.5
"""How long a Dial waits for its node's Splice: a live attached node answers in a round trip."""


@dataclass
class _Node:
    queue: asyncio.Queue[relay_wire.ConnectionOpen | None]
    budget: ByteBudget
    open: int = 0


@dataclass
class _Pending:
    node_id: NodeId
    spliced: asyncio.Future[tuple[grpc.aio.ServicerContext, asyncio.Future[MeshnetError | None]]]


@dataclass
class _Counters:
    open: int = 0
    to_nodes: int = 0
    from_nodes: int = 0
    refused: int = 0
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))


class RelayServicer:
    """The Relay service of one relay process (one event loop)."""

    def __init__(
        self,
        security: LinkSecurity | None,
        advertise: str,
        bounds: RelayBounds,
        *,
        capture_dir: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_crossing: Callable[[float], None] | None = None,
    ) -> None:
        """``on_crossing``: called with the seconds each message spent in the relay, from its
        read returning to its write to the other side returning (the crossing benchmark)."""
        self._security = security
        self._advertise = advertise
        self._bounds = bounds
        self._capture_dir = capture_dir
        self._clock = clock
        self._on_crossing = on_crossing
        self._nodes: dict[NodeId, _Node] = {}
        self._pending: dict[int, _Pending] = {}
        self._counters = _Counters()

    def handler(self) -> grpc.GenericRpcHandler:
        return relay_wire.relay_handler(
            attach=self._typed(self._attach),
            splice=self._typed(self._splice),
            dial=self._typed(self._dial),
            load=self._load,
        )

    def _typed(self, method: Callable[[grpc.aio.ServicerContext], Any]) -> Callable[..., Any]:
        async def handle(_requests: object, context: grpc.aio.ServicerContext) -> None:
            try:
                await method(context)
            except MeshnetError as error:
                if isinstance(error, ResourceExhausted | PermissionDenied | Unauthenticated):
                    self._counters.refused += 1
                await abort_with(context, error)

        return handle

    def _peer(self, context: grpc.aio.ServicerContext, roles: tuple[Role, ...] | None) -> PeerIdentity | None:
        if self._security is None:
            return None
        peer = self._security.peer(context)
        if roles is not None and peer.role not in roles:
            raise PermissionDenied(f"a {peer.role} certificate may not do this on a relay (only {', '.join(roles)})")
        return peer

    async def _attach(self, context: grpc.aio.ServicerContext) -> None:
        peer = self._peer(context, ("worker",))
        hello = await context.read()
        if hello is grpc.aio.EOF:
            return
        node_id = relay_wire.hello_node_id(hello)
        if peer is not None and peer.node_id != node_id:
            raise PermissionDenied(f"a certificate of node {peer.node_id} may not attach as node {node_id}")
        previous = self._nodes.get(node_id)
        admit_attach(self._bounds, len(self._nodes), already_attached=previous is not None)
        if previous is not None:
            previous.queue.put_nowait(None)  # a node re-attaching: its older link ends
        node = self._nodes[node_id] = _Node(
            asyncio.Queue(), ByteBudget(self._bounds.bytes_per_s_per_node, self._clock())
        )
        logger.info("node %s attached", node_id)
        try:
            await context.write(relay_wire.attached_event(f"{node_id}@{self._advertise}"))
            await self._announce(context, node)
        finally:
            if self._nodes.get(node_id) is node:
                del self._nodes[node_id]
            logger.info("node %s detached", node_id)

    async def _announce(self, context: grpc.aio.ServicerContext, node: _Node) -> None:
        """Write each announced connection until the node hangs up (or re-attached elsewhere)."""
        hung_up = asyncio.create_task(_until_eof(context))
        try:
            while True:
                next_open = asyncio.create_task(node.queue.get())
                await asyncio.wait((hung_up, next_open), return_when=asyncio.FIRST_COMPLETED)
                if not next_open.done() or next_open.result() is None:
                    next_open.cancel()
                    return
                await context.write(relay_wire.open_event(next_open.result()))  # type: ignore[arg-type]
        finally:
            hung_up.cancel()

    async def _dial(self, context: grpc.aio.ServicerContext) -> None:
        peer = self._peer(context, None)
        header = await context.read()
        if header is grpc.aio.EOF:
            return
        target = relay_wire.read_dial_header(header)
        node = self._nodes.get(target)
        if node is None:
            raise Unavailable(f"node {target} is not attached to this relay")
        admit_connection(self._bounds, target, node.open)
        connection = next(self._counters.ids)
        pending = _Pending(target, asyncio.get_running_loop().create_future())
        self._pending[connection] = pending
        node.open += 1
        self._counters.open += 1
        try:
            opened = relay_wire.ConnectionOpen(connection, "" if peer is None else peer.node_id)
            await self._connect(context, node, target, opened, pending)
        finally:
            self._pending.pop(connection, None)
            node.open -= 1
            self._counters.open -= 1

    async def _connect(
        self,
        context: grpc.aio.ServicerContext,
        node: _Node,
        target: NodeId,
        opened: relay_wire.ConnectionOpen,
        pending: _Pending,
    ) -> None:
        """Announce the dialer to its node, wait for the node's Splice, copy until either ends."""
        node.queue.put_nowait(opened)
        try:
            splice, ended = await asyncio.wait_for(pending.spliced, SPLICE_TIMEOUT_S)
        except TimeoutError:
            raise Unavailable(f"node {target} did not take the connection within {SPLICE_TIMEOUT_S} s") from None
        error: MeshnetError | None = None
        try:
            await context.write(relay_wire.ACCEPTED)
            error = await self._pump_pair(context, splice, node, target, opened.connection)
        finally:
            if not ended.done():
                ended.set_result(error)
        if error is not None:
            raise error

    async def _splice(self, context: grpc.aio.ServicerContext) -> None:
        peer = self._peer(context, ("worker",))
        header = await context.read()
        if header is grpc.aio.EOF:
            return
        connection = relay_wire.read_splice_header(header)
        pending = self._pending.get(connection)
        if pending is None or pending.spliced.done() or (peer is not None and peer.node_id != pending.node_id):
            raise PermissionDenied(f"no connection {connection} awaits this node")
        ended: asyncio.Future[MeshnetError | None] = asyncio.get_running_loop().create_future()
        pending.spliced.set_result((context, ended))
        error = await ended
        if error is not None:
            raise error

    async def _pump_pair(
        self,
        dial: grpc.aio.ServicerContext,
        splice: grpc.aio.ServicerContext,
        node: _Node,
        target: NodeId,
        connection: int,
    ) -> MeshnetError | None:
        """Copy both ways until either ends; the bound a direction broke, if one did."""
        captures = self._captures(connection)
        copies = (
            asyncio.create_task(self._copy(dial, splice, node, target, captures[0], to_node=True)),
            asyncio.create_task(self._copy(splice, dial, node, target, captures[1], to_node=False)),
        )
        try:
            await asyncio.wait(copies, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for copy in copies:
                copy.cancel()
            results = await asyncio.gather(*copies, return_exceptions=True)
            for capture in captures:
                if capture is not None:
                    capture.close()
        for result in results:
            if isinstance(result, MeshnetError):
                return result
        return None

    async def _copy(
        self,
        source: grpc.aio.ServicerContext,
        sink: grpc.aio.ServicerContext,
        node: _Node,
        target: NodeId,
        capture: BinaryIO | None,
        *,
        to_node: bool,
    ) -> None:
        counters, budget, clock, timed = self._counters, node.budget, self._clock, self._on_crossing
        while (raw := await source.read()) is not grpc.aio.EOF:
            started = clock()
            budget.spend(target, len(raw), started)
            if to_node:
                counters.to_nodes += len(raw)
            else:
                counters.from_nodes += len(raw)
            if capture is not None:
                capture.write(relay_wire.chunk_data(raw))
            await sink.write(raw)
            if timed is not None:
                timed(clock() - started)

    def _captures(self, connection: int) -> tuple[BinaryIO | None, BinaryIO | None]:
        if self._capture_dir is None:
            return None, None
        return (
            (self._capture_dir / f"{connection:06d}-to-node.bin").open("wb"),
            (self._capture_dir / f"{connection:06d}-from-node.bin").open("wb"),
        )

    async def _load(self, _request: object, context: grpc.aio.ServicerContext) -> Any:
        try:
            self._peer(context, None)
        except MeshnetError as error:
            await abort_with(context, error)
        return relay_wire.load_to_proto(self.load())

    def load(self) -> relay_wire.RelayLoadFigures:
        counters = self._counters
        return relay_wire.RelayLoadFigures(
            len(self._nodes), counters.open, counters.to_nodes, counters.from_nodes, counters.refused
        )


async def _until_eof(context: grpc.aio.ServicerContext) -> None:
    """Read (and drop) the node's messages until it ends the stream: its hello, its liveness."""
    with contextlib.suppress(grpc.RpcError):
        while await context.read() is not grpc.aio.EOF:
            pass
