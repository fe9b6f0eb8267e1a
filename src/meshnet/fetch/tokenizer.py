"""Fetching a model's tokenizer by model id: the signed manifest, then its one tokenizer artifact.

What a gateway serving by model id needs, and all it needs: the vocabulary-only GGUF the
publisher cut from the source (``artifact.vocab_only``). The manifest is chosen and its signer
judged exactly as a worker's range fetch does (``fetcher.trusted_manifest``), every piece is
checked against the manifest before it is written and the whole file against the artifact's
sha256 before it takes its final name, so a gateway never tokenizes with bytes nobody signed.
A file already there that verifies is kept; a rerun after an interruption keeps its pieces.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from meshnet.artifact.assemble import DiskFull, PieceRef, PieceRejected, pieces_of
from meshnet.artifact.hashing import file_sha256, partial_path
from meshnet.artifact.manifest import ArtifactEntry, Manifest
from meshnet.core.errors import IntegrityError
from meshnet.fetch.fetcher import Counter, ManifestWanted, atomic_write, model_folder, pull, trusted_manifest
from meshnet.membership.tracker_client import TrackerClient
from meshnet.wire.tls import LinkSecurity

REQUESTS_PER_HOLDER = 2


@dataclass(frozen=True)
class FetchedTokenizer:
    manifest: Manifest
    path: Path
    """The verified vocabulary-only GGUF: describe and tokenize from it."""
    fetched_bytes: int
    """Every byte received (manifests and pieces); 0 pieces when the file was already there."""
    seconds: float


class _ArtifactFile:
    """One whole artifact assembled piece by verified piece in a ``.partial`` file."""

    def __init__(self, entry: ArtifactEntry, target: Path) -> None:
        self.entry = entry
        self.target = target
        self.partial = partial_path(target)
        self._fd = os.open(self.partial, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(self._fd, entry.size)
        except OSError as error:
            os.close(self._fd)
            raise DiskFull(f"cannot size {self.partial.name}: {error.strerror or error}") from None

    def place(self, piece: PieceRef, data: bytes) -> None:
        if len(data) != piece.length or hashlib.sha256(data).hexdigest() != piece.sha256:
            raise PieceRejected(f"piece {piece.index} of the tokenizer artifact does not match the manifest")
        try:
            os.pwrite(self._fd, data, piece.offset)
        except OSError as error:
            raise DiskFull(f"cannot write {self.partial.name}: {error.strerror or error}") from None

    def missing(self) -> tuple[PieceRef, ...]:
        held = [(p, os.pread(self._fd, p.length, p.offset)) for p in pieces_of(self.entry)]
        return tuple(p for p, data in held if hashlib.sha256(data).hexdigest() != p.sha256)

    def finish(self) -> Path:
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        if file_sha256(self.partial) != self.entry.sha256:
            raise IntegrityError(f"the assembled tokenizer artifact is not {self.entry.sha256[:16]}…")
        os.replace(self.partial, self.target)
        return self.target

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def tokenizer_path(data_dir: Path, model_id: str, entry: ArtifactEntry) -> Path:
    return model_folder(data_dir, model_id) / f"tokenizer-{entry.sha256[:16]}.gguf"


async def fetch_tokenizer(
    wanted: ManifestWanted, tracker_address: str, security: LinkSecurity | None = None
) -> FetchedTokenizer:
    """The trusted manifest of ``wanted.model_id`` and its verified tokenizer file in the data dir.

    Raises ``TokenizerArtifactMissing`` for a manifest published without one (schema 1)."""
    started = time.monotonic()
    counter = Counter(security=security)
    tracker = TrackerClient(tracker_address, security=security)
    try:
        found = counter.learn(await tracker.find_holders(wanted.model_id))
        manifest, manifest_data = await trusted_manifest(wanted, found, counter)
        entry = manifest.tokenizer()
        target = tokenizer_path(wanted.data_dir, manifest.model_id, entry)
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target.parent / "manifest.json", manifest_data)
        if not (target.exists() and file_sha256(target) == entry.sha256):
            holders = counter.learn(await tracker.find_holders("", (entry.sha256,)))
            assembled = _ArtifactFile(entry, target)
            try:
                await pull(assembled, assembled.missing(), holders, counter, REQUESTS_PER_HOLDER, None)
                assembled.finish()
            finally:
                assembled.close()
    finally:
        await tracker.close()
        await counter.close()
    return FetchedTokenizer(manifest, target, counter.received, time.monotonic() - started)
