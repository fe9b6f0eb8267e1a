"""Fetching a layer range by model id: the manifest, then only the pieces the range needs.

1. Ask the tracker for the model's manifests and their holders; fetch each, check its signature
   and that its signer is trusted (``artifact.trust``); keep the one most holders hold.
2. Ask who holds each needed artifact (``manifest.needed_artifacts``) and fetch their pieces
   from all of them in parallel (``piece_schedule``): every piece is hashed against the signed
   manifest before it is written (``artifact.assemble``); a holder that sends a bad piece or
   goes away gets no more pieces and its piece is fetched elsewhere.
3. Cut the slice into the node's slice cache and keep the header as a header-only sparse copy
   of the source (what the worker describes the model from): the range is stored once.
A rerun after an interruption keeps every piece already written that still verifies.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from meshnet.artifact.assemble import PieceRef, PieceRejected, SliceBuilder
from meshnet.artifact.cache import HEADER_ONLY_SUFFIX, ShardFiles, SliceCache
from meshnet.artifact.directory import FoundHolders
from meshnet.artifact.hashing import partial_path
from meshnet.artifact.manifest import Manifest, needed_artifacts
from meshnet.artifact.manifest_codec import decode_manifest, verify_manifest_signature
from meshnet.artifact.trust import TrustStore, UntrustedPublisher, judge_publisher
from meshnet.core.addresses import parse_address_list
from meshnet.core.errors import IntegrityError, MeshnetError, Unavailable
from meshnet.core.layers import LayerRange
from meshnet.fetch.holders import artifact_channel, fetch_bytes, fetch_to_end
from meshnet.fetch.schedule import PieceSchedule
from meshnet.membership.channel import RenewingChannel
from meshnet.membership.tracker_client import TrackerClient
from meshnet.security.identity import ANY_WORKER_NAME
from meshnet.wire.tls import LinkSecurity, hop_server_name

logger = logging.getLogger(__name__)
Progress = Callable[[int, int], None]
MODELS_DIR = "models-by-id"


@dataclass(frozen=True)
class FetchConfig:
    model_id: str
    """Model id (the manifest's model_id) to fetch a range of."""
    layers: LayerRange
    """Layers to fetch, A:B half-open (B exclusive)."""
    tracker: str
    """Tracker (host:port, or its replicas: a:7070,b:7070) that knows who holds the model's artifacts."""
    data_dir: Path
    """Where the slice cache, the manifest and the trust store live."""
    trust_publisher: str | None = None
    """Accept only manifests signed by this key fingerprint; none trusts the first key seen per model id."""
    requests_per_holder: int = 2
    """Piece requests in flight to each holder at once."""

    def __post_init__(self) -> None:
        parse_address_list(self.tracker)


@dataclass(frozen=True)
class FetchedRange:
    manifest: Manifest
    manifest_path: Path
    header: Path
    """Header-only sparse copy of the source: describe the model from it, never cut from it."""
    files: ShardFiles
    fetched_bytes: int
    """Every byte received (manifests, pieces, refused pieces)."""
    needed_bytes: int
    """Sum of the sizes of the artifacts the range needs."""
    seconds: float
    bad_holders: tuple[str, ...]
    dead_holders: tuple[str, ...]


@dataclass
class Counter:
    received: int = 0
    channels: dict[str, RenewingChannel] = field(default_factory=dict)
    security: LinkSecurity | None = None
    holder_ids: dict[str, str] = field(default_factory=dict)
    """address -> the holder the directory names there (secured, its certificate's node id)."""

    def learn(self, found: FoundHolders) -> FoundHolders:
        self.holder_ids.update((holder.address, holder.holder_id) for holder in found.holders)
        return found

    def channel(self, address: str) -> RenewingChannel:
        if address not in self.channels:
            # Pinned to the holder's own name: another node at that address fails the handshake.
            name = hop_server_name(self.holder_ids.get(address)) if self.security else ANY_WORKER_NAME
            self.channels[address] = artifact_channel(address, self.security, name)
        return self.channels[address]

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.channels.values()), return_exceptions=True)


def model_folder(data_dir: Path, model_id: str) -> Path:
    return Path(data_dir) / MODELS_DIR / model_id


@dataclass(frozen=True)
class ManifestWanted:
    """Which model's manifest to accept, and whose signature: what every fetch starts from."""

    model_id: str
    data_dir: Path
    trust_publisher: str | None = None


async def trusted_manifest(
    config: FetchConfig | ManifestWanted, found: FoundHolders, counter: Counter
) -> tuple[Manifest, bytes]:
    """The trusted manifest most holders hold, checked and (on first use) recorded."""
    trust = TrustStore(config.data_dir)
    reasons: list[str] = []
    candidates: list[tuple[int, str, Manifest, bytes, bool]] = []
    for digest in found.manifests:
        holders = [h for h in found.holders if digest in h.artifacts]
        data = await _manifest_bytes(digest, [h.address for h in holders], counter)
        if data is None:
            reasons.append(f"manifest {digest[:12]}…: no holder delivered it")
            continue
        try:
            manifest = decode_manifest(data)
            fingerprint = verify_manifest_signature(manifest)
        except MeshnetError as error:
            reasons.append(f"manifest {digest[:12]}…: {error.message}")
            continue
        verdict = judge_publisher(config.model_id, fingerprint, config.trust_publisher, trust.recorded(config.model_id))
        if manifest.model_id != config.model_id or not verdict.accepted:
            reasons.append(verdict.reason if verdict.accepted is False else f"manifest names {manifest.model_id}")
            continue
        candidates.append((len(holders), digest, manifest, data, verdict.record))
    if not candidates:
        detail = "; ".join(reasons) or "no holder announced one"
        raise UntrustedPublisher(f"no acceptable manifest for model {config.model_id}: {detail}")
    _, _, manifest, data, record = max(candidates, key=lambda c: (c[0], c[1]))
    if record and manifest.publisher is not None:
        trust.record(config.model_id, manifest.publisher)
    return manifest, data


async def _manifest_bytes(digest: str, addresses: list[str], counter: Counter) -> bytes | None:
    for address in addresses:
        try:
            data = await fetch_to_end(counter.channel(address), digest)
        except MeshnetError as error:
            logger.warning("manifest %s from %s: %s", digest[:12], address, error.message)
            continue
        counter.received += len(data)
        if hashlib.sha256(data).hexdigest() == digest:
            return data
    return None


class PiecePlacer(Protocol):
    def place(self, piece: PieceRef, data: bytes) -> None: ...


async def pull(
    builder: PiecePlacer,
    pieces: tuple[PieceRef, ...],
    holders: FoundHolders,
    counter: Counter,
    requests_per_holder: int,
    progress: Progress | None,
) -> PieceSchedule:
    """Fetch ``pieces`` from every holder at once, each placed (and verified) by ``builder``."""
    holders_of: dict[str, set[str]] = {}
    for holder in holders.holders:
        for artifact in holder.artifacts:
            holders_of.setdefault(artifact, set()).add(holder.address)
    schedule = PieceSchedule.of(pieces, {k: frozenset(v) for k, v in holders_of.items()})
    changed = asyncio.Condition()
    total = sum(p.length for p in pieces)
    placed = [0]

    async def worker(address: str) -> None:
        while not schedule.complete() and schedule.usable(address):
            piece = schedule.next_for(address)
            if piece is None:
                if not schedule.in_flight:
                    return
                async with changed:
                    await changed.wait()
                continue
            if await _deliver(builder, counter, schedule, address, piece):
                placed[0] += piece.length
                if progress is not None:
                    progress(placed[0], total)
            async with changed:
                changed.notify_all()

    addresses = sorted({h.address for h in holders.holders})
    # A task group, so a fatal error (a full disk) in one request stops the others at once.
    try:
        async with asyncio.TaskGroup() as group:
            for address in addresses:
                for _ in range(requests_per_holder):
                    group.create_task(worker(address))
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None  # the typed error itself, not its group
    if not schedule.complete():
        stranded = schedule.stranded() or schedule.pending
        raise Unavailable(
            f"{len(stranded)} pieces (first: artifact {stranded[0].artifact[:12]}… piece {stranded[0].index}) "
            "have no working holder left; run the fetch again to resume"
        )
    return schedule


async def _deliver(
    builder: PiecePlacer, counter: Counter, schedule: PieceSchedule, address: str, piece: PieceRef
) -> bool:
    """Fetch ``piece`` from ``address`` and place it; on failure tell the schedule whose fault it was."""
    try:
        data = await fetch_bytes(counter.channel(address), piece.artifact, piece.offset, piece.length)
        counter.received += len(data)
        await asyncio.to_thread(builder.place, piece, data)
    except (PieceRejected, IntegrityError) as error:
        logger.warning("holder %s sent a bad piece, dropping it: %s", address, error.message)
        schedule.failed(piece, address, bad=True)
    except Unavailable as error:
        logger.warning("holder %s failed, fetching elsewhere: %s", address, error.message)
        schedule.failed(piece, address, bad=False)
    except MeshnetError as error:
        if error.code == "disk_full":
            raise
        logger.warning("holder %s refused a piece: %s", address, error.message)
        schedule.failed(piece, address, bad=False)
    else:
        schedule.finished(piece)
        return True
    return False


def _write_header_only(builder: SliceBuilder, folder: Path) -> Path:
    """Keep the verified header as a sparse copy of the source (holes where the tensors are)."""
    manifest = builder.manifest
    target = folder / f"{manifest.source.sha256[:16]}{HEADER_ONLY_SUFFIX}"
    header = manifest.of_kind("metadata")[0]
    data = b"".join(builder.read(p) for p in builder.header_pieces())
    partial = partial_path(target)
    try:
        with open(partial, "wb") as handle:
            handle.write(data[: header.size])
            handle.truncate(manifest.source.size)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


async def fetch_range(
    config: FetchConfig, progress: Progress | None = None, security: LinkSecurity | None = None
) -> FetchedRange:
    """Fetch, verify and assemble ``config.layers`` of ``config.model_id`` into the data dir.

    ``security``: the swarm identity every link (tracker and holders) uses; None is plaintext."""
    started = time.monotonic()
    counter = Counter(security=security)
    tracker = TrackerClient(config.tracker, security=security)
    try:
        found = counter.learn(await tracker.find_holders(config.model_id))
        manifest, manifest_data = await trusted_manifest(config, found, counter)
        needed = needed_artifacts(manifest, config.layers)
        holders = counter.learn(await tracker.find_holders("", tuple(e.sha256 for e in needed)))
        folder = model_folder(config.data_dir, manifest.model_id)
        folder.mkdir(parents=True, exist_ok=True)
        manifest_path = folder / "manifest.json"
        atomic_write(manifest_path, manifest_data)
        cache = SliceCache(Path(config.data_dir) / "cache")
        with SliceBuilder(manifest, config.layers, folder / "partial") as builder:
            requests = config.requests_per_holder
            header = await pull(builder, builder.missing(builder.header_pieces()), holders, counter, requests, None)
            builder.locate_tensors()
            body = await pull(builder, builder.missing(builder.body_pieces()), holders, counter, requests, progress)
            header_path = _write_header_only(builder, folder)
            files = await asyncio.to_thread(builder.finish, cache)
        cache.remember_source(header_path, manifest.source.sha256)
        with contextlib.suppress(OSError):
            (folder / "partial").rmdir()  # empty unless another range is half-fetched
    finally:
        await tracker.close()
        await counter.close()
    return FetchedRange(
        manifest,
        manifest_path,
        header_path,
        files,
        counter.received,
        sum(e.size for e in needed),
        time.monotonic() - started,
        tuple(sorted(header.bad | body.bad)),
        tuple(sorted(header.dead | body.dead)),
    )


def atomic_write(path: Path, data: bytes) -> None:
    partial = partial_path(path)
    try:
        with open(partial, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
