"""The row exchange of a networked expert-parallel node: one long-lived stream per peer pair.

Node ``j`` opens ``ExchangeRows`` to every node ``i < j``; the stream carries frames both ways.
Each link has an outbox (drained by the gRPC stream) and an inbox (filled by a pump thread that
reads the other direction). A stream that ends or breaks puts a "lost" marker in the inbox, so
an exchange waiting on a dead peer fails at once (a killed process closes its sockets) rather
than at the deadline; the deadline covers a peer that hangs. Every frame is decoded strictly
and must carry the expected sender, exchange sequence and layer.

A peer is listed as ``HOST:PORT`` or ``NODE_ID@HOST:PORT``: with a node id, only that node's
certificate may answer at the address or send as that index (one node cannot stand in for
another); without one, any worker of the swarm may.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import numpy as np

from meshnet.core.errors import DeadlineExceeded, InvalidArgument, MeshnetError, Unavailable
from meshnet.moe import wire as expert_wire
from meshnet.moe.frames import decode_slot_rows, encode_slot_rows
from meshnet.moe.ownership import ExchangeGeometry, ExpertOwnership, ExpertRowsConflict, SlotRows
from meshnet.security.identity import check_node_id

log = logging.getLogger(__name__)
STATS_WINDOW = 4096
"""Exchanges whose latency the node keeps for its p50/p95."""
_LOST = b""
"""Inbox marker: the stream from this peer has ended (frames are never empty)."""


@dataclass(frozen=True)
class ExpertPeer:
    """One entry of ``--expert-peers``: where the node listens and, if known, who it is."""

    address: str
    node_id: str | None = None

    @classmethod
    def parse(cls, entry: str) -> ExpertPeer:
        node_id, _, address = entry.strip().rpartition("@")
        if not address or ":" not in address:
            raise InvalidArgument(f"an expert peer is HOST:PORT or NODE_ID@HOST:PORT, got {entry!r}")
        return cls(address, check_node_id(node_id) if node_id else None)

    def __str__(self) -> str:
        return f"{self.node_id}@{self.address}" if self.node_id else self.address


class PeerLink:
    """Frames to and from one peer over one stream."""

    def __init__(self, own_index: int, peer: int) -> None:
        self.own_index = own_index
        self.peer = peer
        self._outbox: queue.Queue[bytes | None] = queue.Queue()
        self._inbox: queue.Queue[bytes] = queue.Queue()
        self.lost = threading.Event()
        self._cancel: Callable[[], object] | None = None
        """For a stream this node opened: cancels the call, so the peer's side ends at once too."""

    def cancel_with(self, cancel: Callable[[], object]) -> None:
        self._cancel = cancel

    def send(self, frame: bytes) -> None:
        self._outbox.put(frame)

    def outgoing(self, opening: expert_wire.ExpertRowsFrame | None = None) -> Iterator[expert_wire.ExpertRowsFrame]:
        """The messages this side writes: an optional opening message, then frames until closed."""
        if opening is not None:
            yield opening
        while True:
            frame = self._outbox.get()
            if frame is None:
                return
            yield expert_wire.ExpertRowsFrame(sender=self.own_index, frame=frame)

    def pump(self, incoming: Iterator[expert_wire.ExpertRowsFrame]) -> None:
        """Read the peer's messages into the inbox until the stream ends (run in a thread)."""
        try:
            for message in incoming:
                if message.sender != self.peer or not message.frame:
                    log.warning("peer %d sent a message as %d or empty: closing the link", self.peer, message.sender)
                    break
                self._inbox.put(message.frame)
        except grpc.RpcError as error:
            log.info("row stream to peer %d ended: %s", self.peer, getattr(error, "code", lambda: "?")())
        finally:
            self.lost.set()
            self._inbox.put(_LOST)

    def receive(self, timeout_s: float) -> bytes:
        try:
            frame = self._inbox.get(timeout=timeout_s)
        except queue.Empty:
            raise DeadlineExceeded(f"peer {self.peer} sent no expert rows within {timeout_s:g} s") from None
        if frame == _LOST:
            self._inbox.put(_LOST)  # stays lost for every later exchange
            raise Unavailable(f"expert group peer {self.peer} is lost (its row stream ended)")
        return frame

    def close(self) -> None:
        self._outbox.put(None)  # ends what this side writes (a stream it accepted ends with it)
        if self._cancel is not None:
            self._cancel()  # half-closing a stream it opened would leave the peer's side waiting


class GrpcRowExchange:
    """``RowExchange`` over the node's peer links; links are added as streams come up."""

    def __init__(self, ownership: ExpertOwnership, geometry: ExchangeGeometry, timeout_s: float) -> None:
        self._ownership = ownership
        self._geometry = geometry
        self._timeout_s = timeout_s
        self._links: dict[int, PeerLink] = {}
        self._lock = threading.Lock()
        self._durations: deque[float] = deque(maxlen=STATS_WINDOW)
        self.exchanges = 0
        self.frame_bytes_sent = 0
        self.complete = threading.Event()
        """Set once a link to every other node is up (at once for a group of one)."""
        if ownership.count == 1:
            self.complete.set()

    @property
    def connected(self) -> int:
        with self._lock:
            return sum(1 for link in self._links.values() if not link.lost.is_set())

    def add(self, link: PeerLink) -> bool:
        """Register a peer's link; False if that peer is connected already (a duplicate stream)."""
        with self._lock:
            current = self._links.get(link.peer)
            if current is not None and not current.lost.is_set():
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
        started = time.perf_counter()
        frame = encode_slot_rows(rows, self._geometry)
        with self._lock:
            links = [self._links[p] for p in sorted(self._links)]
        if len(links) != self._ownership.count - 1:
            raise Unavailable(f"only {len(links)} of {self._ownership.count - 1} expert peers are connected")
        for link in links:
            link.send(frame)
        received = []
        for link in links:
            part = decode_slot_rows(link.receive(self._timeout_s), self._geometry)
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
        """This node failed: close every stream so the peers fail at once too."""
        log.warning("expert node %s leaves its group: %s", self._ownership.label, reason.message)
        self.close()

    def close(self) -> None:
        with self._lock:
            links = list(self._links.values())
        for link in links:
            link.close()
