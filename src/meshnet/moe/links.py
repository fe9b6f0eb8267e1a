"""The row exchange of a networked expert-parallel node: one long-lived stream per peer pair.

Node ``j`` opens ``ExchangeRows`` to every node ``i < j``; the stream carries frames both ways.
Each stream lives on the node's event loop, with a writer task draining the link's outbox and a
reader task filling its inbox (the reader always drains, so two peers writing large frames at
once never wait on each other's flow control). A stream that ends or breaks puts a "lost"
marker in the inbox, so an exchange waiting on a dead peer fails at once (a killed process
closes its sockets) rather than at the deadline; the deadline covers a peer that hangs.

The engine thread cannot yield to the loop: it is inside llama.cpp's graph, in the eval
callback. So ``GrpcRowExchange.exchange`` encodes its frame there, hands it to the loop with one
``call_soon_threadsafe`` and blocks on the links' inboxes, which are thread-safe queues: one
crossing each way per layer, no coroutine or future per exchange (measured against a
``run_coroutine_threadsafe`` swap: that one added about 100 us per exchange). Every frame is
decoded strictly on the engine thread and must carry the expected sender, exchange sequence and
layer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable

import grpc
import grpc.aio
import numpy as np

from meshnet.core.errors import DeadlineExceeded, MeshnetError, Unavailable
from meshnet.moe import wire as expert_wire
from meshnet.moe.frames import decode_slot_rows, encode_slot_rows
from meshnet.moe.ownership import ExchangeGeometry, ExpertOwnership, ExpertRowsConflict, SlotRows

log = logging.getLogger(__name__)
STATS_WINDOW = 4096
"""Exchanges whose latency the node keeps for its p50/p95."""
_LOST = b""
"""Inbox marker: the stream from this peer has ended (frames are never empty)."""

Read = Callable[[], Awaitable[object]]
"""A stream's ``read``: the next message, or ``grpc.aio.EOF``."""
Write = Callable[[expert_wire.ExpertRowsFrame], Awaitable[None]]


class PeerLink:
    """Frames to and from one peer over one stream.

    Its stream lives on the node's event loop: a writer task drains the outbox in order, a
    reader task fills the inbox. The inbox is a thread-safe queue, so the engine thread takes
    the peer's frame straight from it without a round trip through the loop."""

    def __init__(self, own_index: int, peer: int, write: Write, cancel: Callable[[], object] | None = None) -> None:
        """``cancel``: for a stream this node opened, cancels the call (half-closing it would
        leave the peer's side waiting); an accepted stream ends when its handler returns."""
        self.own_index = own_index
        self.peer = peer
        self._write = write
        self._cancel = cancel
        self._outbox: asyncio.Queue[bytes] = asyncio.Queue()
        self._inbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self.ended = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def lost(self) -> bool:
        return self.ended.is_set()

    def start(self, read: Read) -> None:
        """Start the stream's reader and writer tasks; they run until the stream ends."""
        self._tasks = [
            asyncio.create_task(self._read_all(read), name=f"rows-from-{self.peer}"),
            asyncio.create_task(self._write_all(), name=f"rows-to-{self.peer}"),
        ]

    async def serve(self, read: Read) -> None:
        """Run an accepted stream until either side ends it (its handler returns then)."""
        self.start(read)
        try:
            await self.ended.wait()
        finally:
            self.close()  # cancelled by the peer, or ended by this node: either way the link is gone

    async def _read_all(self, read: Read) -> None:
        try:
            while True:
                message = await read()
                if not isinstance(message, expert_wire.ExpertRowsFrame):
                    return  # grpc.aio.EOF: the peer ended its side
                if message.sender != self.peer or not message.frame:
                    log.warning("peer %d sent a message as %d or empty: closing the link", self.peer, message.sender)
                    return
                self._inbox.put(message.frame)
        except grpc.RpcError as error:
            log.info("row stream to peer %d ended: %s", self.peer, getattr(error, "code", lambda: "?")())
        finally:
            self._mark_lost()

    async def _write_all(self) -> None:
        try:
            while True:
                frame = await self._outbox.get()
                await self._write(expert_wire.ExpertRowsFrame(sender=self.own_index, frame=frame))
        except Exception as error:  # the call finished, was aborted or cancelled under us: the peer is gone
            log.info("row stream to peer %d cannot be written: %r", self.peer, error)
            self._mark_lost()

    def _mark_lost(self) -> None:
        if not self.ended.is_set():
            self.ended.set()
            self._inbox.put(_LOST)

    def send(self, frame: bytes) -> None:
        """Queue ``frame`` for the peer (on the loop)."""
        self._outbox.put_nowait(frame)

    def receive(self, timeout_s: float) -> bytes:
        """The peer's next frame (any thread; blocks up to ``timeout_s``)."""
        try:
            frame = self._inbox.get(timeout=timeout_s)
        except queue.Empty:
            raise DeadlineExceeded(f"peer {self.peer} sent no expert rows within {timeout_s:g} s") from None
        if frame == _LOST:
            self._inbox.put(_LOST)  # stays lost for every later exchange
            raise Unavailable(f"expert group peer {self.peer} is lost (its row stream ended)")
        return frame

    def close(self) -> None:
        """End this link (on the loop): its stream ends on both sides, an exchange waiting on it fails."""
        if self._cancel is not None:
            self._cancel()
        for task in self._tasks:
            task.cancel()
        self._mark_lost()


async def open_link(channel: grpc.aio.Channel, own_index: int, peer: int, model_sha256: str) -> PeerLink:
    """Open the row stream to node ``peer`` over ``channel`` (it accepts it) and start it."""
    call = expert_wire.ExpertGroupStub(channel).ExchangeRows()
    link = PeerLink(own_index, peer, call.write, call.cancel)
    try:
        await call.write(expert_wire.ExpertRowsFrame(sender=own_index, model_sha256=model_sha256))
    except (grpc.RpcError, asyncio.InvalidStateError):
        raise Unavailable(f"expert peer {peer} ended the row stream at once") from None
    link.start(call.read)
    return link


class GrpcRowExchange:
    """``RowExchange`` over the node's peer links; links are added as streams come up.

    ``exchange`` and ``abort`` are called on the engine thread; everything else on ``loop``."""

    def __init__(
        self, ownership: ExpertOwnership, geometry: ExchangeGeometry, timeout_s: float, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._ownership = ownership
        self._geometry = geometry
        self._timeout_s = timeout_s
        self._loop = loop
        self._links: dict[int, PeerLink] = {}
        self._lock = threading.Lock()
        """Guards the links and figures, which the engine thread reads and the loop changes."""
        self._durations: deque[float] = deque(maxlen=STATS_WINDOW)
        self.exchanges = 0
        self.frame_bytes_sent = 0
        self.complete = asyncio.Event()
        """Set once a link to every other node is up (at once for a group of one)."""
        if ownership.count == 1:
            self.complete.set()

    @property
    def connected(self) -> int:
        with self._lock:
            return sum(1 for link in self._links.values() if not link.lost)

    def missing(self) -> str:
        """Which peers this node lacks, named (``peer 1 is lost``, ``peer 2 has not connected``);
        empty when every one is connected."""
        with self._lock:
            links = dict(self._links)
        others = (peer for peer in range(self._ownership.count) if peer != self._ownership.index)
        gaps = [
            f"peer {peer} is lost" if peer in links else f"peer {peer} has not connected"
            for peer in others
            if peer not in links or links[peer].lost
        ]
        return ", ".join(gaps)

    def add(self, link: PeerLink) -> bool:
        """Register a peer's link; False if that peer is connected already (a duplicate stream)."""
        with self._lock:
            current = self._links.get(link.peer)
            if current is not None and not current.lost:
                return False
            self._links[link.peer] = link
            if len(self._links) == self._ownership.count - 1:
                self.complete.set()
            return True

    def latency_us(self) -> tuple[float, float]:
        """p50 and p95 of the last exchanges' wall time, in microseconds (0 before any)."""
        with self._lock:
            durations = list(self._durations)
        if not durations:
            return 0.0, 0.0
        p50, p95 = np.percentile(np.array(durations) * 1e6, [50, 95])
        return float(p50), float(p95)

    def exchange(self, rows: SlotRows) -> list[SlotRows]:
        """This node's rows for every other node's (engine thread: blocks until they are in)."""
        started = time.perf_counter()
        frame = encode_slot_rows(rows, self._geometry)
        with self._lock:
            links = [self._links[peer] for peer in sorted(self._links)]
        if len(links) != self._ownership.count - 1:
            raise Unavailable(f"only {len(links)} of {self._ownership.count - 1} expert peers are connected")
        self._loop.call_soon_threadsafe(_send_all, links, frame)
        deadline = started + self._timeout_s
        received = []
        for link in links:
            part = decode_slot_rows(link.receive(max(deadline - time.perf_counter(), 0.0)), self._geometry)
            if (part.sender, part.sequence, part.layer) != (link.peer, rows.sequence, rows.layer):
                raise ExpertRowsConflict(
                    f"peer {link.peer} sent rows of node {part.sender}, exchange {part.sequence}, layer {part.layer}; "
                    f"expected exchange {rows.sequence}, layer {rows.layer}"
                )
            received.append(part)
        with self._lock:
            self._durations.append(time.perf_counter() - started)
            self.exchanges += 1
            self.frame_bytes_sent += len(frame) * len(links)
        return received

    def abort(self, reason: MeshnetError) -> None:
        """This node failed (engine thread): close every stream so the peers fail at once too."""
        log.warning("expert node %s leaves its group: %s", self._ownership.label, reason.message)
        with contextlib.suppress(RuntimeError):  # the loop has closed: the process is ending anyway
            self._loop.call_soon_threadsafe(self.close)

    def close(self) -> None:
        with self._lock:
            links = list(self._links.values())
        for link in links:
            link.close()


def _send_all(links: list[PeerLink], frame: bytes) -> None:
    for link in links:
        link.send(frame)
