"""A local, content-addressed cache of slices cut from source models.

Slices are keyed by the source's sha256 and the range, so two workers on one machine share
files and a changed source can never be served from a stale slice. The source hash itself is
remembered per (path, size, mtime) because hashing a large model takes minutes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from meshnet.artifact.gguf_split import model_sha256, open_model, source_files
from meshnet.artifact.hashing import partial_path
from meshnet.artifact.slicing import slice_role, verify_slice, write_embedding_table, write_slice
from meshnet.core.errors import ArtifactError, MeshnetError
from meshnet.core.layers import LayerRange

HEADER_ONLY_SUFFIX = ".header-only.gguf"
"""A sparse copy of a source holding only its header (``fetch``): described, never cut from."""


@dataclass(frozen=True)
class ShardFiles:
    slice: Path
    embeddings: Path | None
    """The quantized token table, for head shards only."""
    source_sha256: str


class SliceCache:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def source_sha256(self, source: Path) -> str:
        key, index = self._index(source)
        if key not in index:
            index[key] = model_sha256(open_model(source))
            self._save_index(index)
        return index[key]

    def remember_source(self, source: Path, sha256: str) -> None:
        """Record ``source``'s hash without reading it (a header-only copy has the manifest's)."""
        key, index = self._index(source)
        self._save_index({**index, key: sha256})

    def _index(self, source: Path) -> tuple[str, dict[str, str]]:
        # Every part of a gguf-split set is in the key: replacing any one must re-hash the set.
        key = "+".join(f"{p.resolve()}|{p.stat().st_size}|{p.stat().st_mtime_ns}" for p in source_files(source))
        index_path = self.root / "source-hashes.json"
        index: dict[str, str] = {}
        if index_path.exists():
            try:
                index = json.loads(index_path.read_text())
            except (OSError, ValueError):
                index = {}  # a damaged index only costs a re-hash
        return key, index

    def _save_index(self, index: dict[str, str]) -> None:
        index_path = self.root / "source-hashes.json"
        self.root.mkdir(parents=True, exist_ok=True)
        partial = partial_path(index_path)
        partial.write_text(json.dumps(index, indent=1))
        os.replace(partial, index_path)

    def shard_files(
        self, source: Path, layers: LayerRange, n_layers: int, *, source_sha256: str | None = None
    ) -> ShardFiles:
        """Slice (and for a head, embedding table) for ``layers`` of ``source``, cut if missing.

        ``source_sha256`` skips hashing ``source``: an assembler's sparse copy of the source
        (``assemble.py``) has the source's hash from the signed manifest, not from its bytes."""
        digest = source_sha256 or self.source_sha256(source)
        folder = self.root / "slices" / digest[:16]
        folder.mkdir(parents=True, exist_ok=True)
        slice_path = folder / f"layers-{layers.start}-{layers.stop}.gguf"
        cut = lambda: write_slice(source, layers, slice_path, source_sha256=digest)  # noqa: E731
        self._ensure(slice_path, cut, layers, digest, Path(source))
        embeddings = None
        if slice_role(layers, n_layers) == "head":
            embeddings = folder / "token-embeddings.gguf"
            self._ensure(
                embeddings,
                lambda: write_embedding_table(source, embeddings, source_sha256=digest),
                None,
                digest,
                Path(source),
            )
        return ShardFiles(slice_path, embeddings, digest)

    @staticmethod
    def _ensure(
        path: Path, make: Callable[[], object], layers: LayerRange | None, digest: str, source: Path | None = None
    ) -> None:
        # Under the file's lock: processes started together on one machine (an expert group's
        # nodes, which all cut the whole-model slice) must not each cut it and rename over the
        # copy another one has already mapped; the later ones wait and use the first one's file.
        with _exclusive(path):
            if path.exists():
                try:
                    verify_slice(path, layers=layers, source_sha256=digest)
                    return
                except MeshnetError:
                    path.unlink(missing_ok=True)  # damaged or foreign: cut it again
            if source is not None and source.name.endswith(HEADER_ONLY_SUFFIX):
                # Its tensor bytes are holes: cutting from it would make a slice of zeros.
                raise ArtifactError(
                    f"{path.name} is missing or damaged and {source.name} holds no weights: fetch again"
                )
            make()


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path``'s lock file (kept beside it, never removed: removing it
    would let a third process lock a new file while the second still holds the old one)."""
    descriptor = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock
