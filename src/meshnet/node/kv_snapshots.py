"""A shard's KV snapshots of its sessions: taken every ``every`` positions, kept on its disk,
listed to a resuming driver and restored into a session the driver fails over.

A snapshot is taken the moment a step's KV reaches an absolute multiple of ``every`` (a multiple
of the prefill chunk, so a piece boundary of any prefill and the end of a decode step): the
engine loop exports the slot between its ticks, and the file is packed (hashed) and written off
the event loop. Snapshots are keyed by session and position; the head, the one shard that sees
tokens, binds each to the session's token link (``core.snapshot``), carried on from the link the
session opened with, and checks it against the resuming driver's; the shards after it write
``UNBOUND``. A session the head opened on a reused prompt prefix links on from the prefix's link
the route's driver sent with it (``KvPlan.tokens_link``: the head holds the prefix's chain, not its
tokens); one opened there without a link is not snapshotted on the head (nor resumed from one).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from meshnet.core.errors import PrefixEvicted, SnapshotRefused
from meshnet.core.ids import SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.snapshot import TOKENS_SEED, UNBOUND, SnapshotPlan, token_chain
from meshnet.engine.backend import StepInput, StepOutput
from meshnet.node.metrics import SnapshotFigures
from meshnet.node.snapshot_peers import SnapshotPeers
from meshnet.process.heap import release_free_heap
from meshnet.session.engine_loop import EngineLoop
from meshnet.session.snapshot_disk import SnapshotDisk
from meshnet.session.snapshots import Expected, pack, read_header, unpack

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SnapshotSettings:
    disk: SnapshotDisk
    every: int
    """Positions between snapshots (a multiple of the prefill chunk); 0: none taken."""
    peers: SnapshotPeers | None = None
    """Where each snapshot is copied too (``node.snapshot_peers``); None: nowhere."""


@dataclass
class SnapshotStats:
    taken: int = 0
    restored: int = 0
    refused: int = 0
    bytes_written: int = 0
    copies_kept: int = 0
    """Peers' snapshots kept here."""


class KvSnapshots:
    """The snapshots one shard takes, keeps and restores."""

    def __init__(
        self, disk: SnapshotDisk, loop: EngineLoop, *, every: int, fingerprint: str, layers: LayerRange
    ) -> None:
        self.disk = disk
        self.stats = SnapshotStats()
        self._loop = loop
        self._every = every
        self._fingerprint = fingerprint
        self._layers = layers
        self._takes_tokens = loop.backend.shape.takes_tokens
        self._links: dict[SessionId, bytes | None] = {}
        self._writes: dict[SessionId, asyncio.Task[None]] = {}
        self.peers: SnapshotPeers | None = None

    @classmethod
    def of(cls, settings: SnapshotSettings | None, loop: EngineLoop, fingerprint: str) -> KvSnapshots:
        """The snapshots of a shard running ``loop``'s layers of recipe ``fingerprint``."""
        settings = settings or SnapshotSettings(SnapshotDisk(Path(), 0), 0)
        layers = loop.backend.shape.layers
        kept = cls(settings.disk, loop, every=settings.every, fingerprint=fingerprint, layers=layers)
        kept.peers = settings.peers
        return kept

    @property
    def enabled(self) -> bool:
        return self._every > 0 and self.disk.enabled

    def figures(self) -> SnapshotFigures:
        stats, disk, peers = self.stats, self.disk, self.peers
        return SnapshotFigures(
            taken=stats.taken,
            restored=stats.restored,
            refused=stats.refused,
            copies_sent=0 if peers is None else peers.copies_sent,
            copies_kept=stats.copies_kept,
            disk_bytes=disk.bytes_held,
            disk_budget_bytes=disk.budget_bytes,
            disk_evictions=disk.evictions,
            has_peer=peers is not None and peers.peer is not None,
        )

    def held(self, fingerprint: str, key: SessionId) -> list[int]:
        """Positions of the session's snapshots held here, newest first (none for another recipe)."""
        return self.disk.positions(key) if fingerprint == self._fingerprint and self.disk.enabled else []

    def opened(self, key: SessionId, position: int, link: bytes) -> None:
        """A session opened without a snapshot: the head links its tokens on from the seed (at
        0) or from the reused prefix's link the driver sent (none: it snapshots nothing)."""
        self._links[key] = TOKENS_SEED if position == 0 else (link or None)

    async def restore(self, key: SessionId, slot: int, plan: SnapshotPlan) -> None:
        """Import the session's snapshot at ``plan.position`` into ``slot``: PrefixEvicted when
        none is held, SnapshotRefused when it fails a check (before llama.cpp sees it) or does
        not load."""
        data = await asyncio.to_thread(self.disk.get, key, plan.position) if self.disk.enabled else None
        if data is None:
            raise PrefixEvicted(f"this shard holds no snapshot of the session at position {plan.position}")
        link = plan.tokens_link if self._takes_tokens else UNBOUND
        expected = Expected(self._fingerprint, self._layers, key, plan.position, link)
        try:
            _, payload = await asyncio.to_thread(unpack, data, expected)
            await self._loop.call(lambda backend: backend.import_slot(slot, payload, plan.position))
        except SnapshotRefused:
            self.stats.refused += 1
            raise
        self.stats.restored += 1
        self._links[key] = plan.tokens_link

    async def run(self, key: SessionId, step: StepInput, deadline: float | None) -> StepOutput:
        """Run ``step``, snapshotting the slot if its KV reaches a multiple of ``every`` in it."""
        at, link = self._due(key, step)
        if at is None:
            return await self._loop.run_step(step, deadline=deadline)
        output, blob = await self._loop.run_exporting(step, at, deadline=deadline)
        if blob is not None and key not in self._writes:
            task = asyncio.get_running_loop().create_task(self._write(key, at, link, blob))
            self._writes[key] = task
            task.add_done_callback(lambda _: self._writes.pop(key, None))
        return output

    def advance(self, key: SessionId, step: StepInput) -> None:
        """Carry the head's token link over a step that took no snapshot (a prefix save)."""
        self._due(key, step)

    def _due(self, key: SessionId, step: StepInput) -> tuple[int | None, bytes]:
        """Where in ``step`` a snapshot falls (None: nowhere) and the token link there; the
        session's link moves on to the step's end."""
        end = step.position + step.n_tokens
        at: int | None = end // self._every * self._every if self.enabled else None
        if at is not None and at <= step.position:
            at = None
        if not self._takes_tokens:
            return at, UNBOUND
        link = self._links.get(key)
        if link is None or step.tokens is None:
            return None, UNBOUND  # a session opened on a reused prefix: its tokens are not all known
        if at is None:
            self._links[key] = token_chain(link, step.tokens)
            return None, UNBOUND
        split = at - step.position
        at_link = token_chain(link, step.tokens[:split])
        self._links[key] = token_chain(at_link, step.tokens[split:])
        return at, at_link

    async def _write(self, key: SessionId, at: int, link: bytes, blob: bytes) -> None:
        data = await asyncio.to_thread(pack, self._fingerprint, self._layers, key, at, link, blob)
        del blob  # packed into data
        try:
            await self._keep(key, at, data)
        finally:
            # The export and its packed copy were MiBs of heap, which glibc keeps resident once
            # freed (process/heap.py): hand them back, as after a prefix save (node/kv_reuse.py).
            del data
            release_free_heap()

    async def _keep(self, key: SessionId, at: int, data: bytes) -> None:
        if not await asyncio.to_thread(self.disk.put, key, at, data):
            log.info("snapshot of %d positions (%d bytes) exceeds the snapshot disk budget", at, len(data))
            return
        self.stats.taken += 1
        self.stats.bytes_written += len(data)
        if self.peers is not None:
            await self.peers.send(data)

    async def keep_copy(self, data: bytes) -> bool:
        """Keep a peer's snapshot, refused (SnapshotRefused) unless whole and of this shard's
        recipe and layers; False when this shard keeps no snapshots or it exceeds the budget."""
        if not self.disk.enabled:
            return False
        header, _ = read_header(data)
        await asyncio.to_thread(unpack, data, Expected(self._fingerprint, self._layers, header.session_id))
        kept = await asyncio.to_thread(self.disk.put, header.session_id, header.positions, data)
        self.stats.copies_kept += int(kept)
        return kept

    def close(self, key: SessionId) -> None:
        self._links.pop(key, None)
