"""Assembling a range slice from artifacts, piece by verified piece.

The pieces a range needs are written into a *sparse* copy of the source: the header at 0 and
each tensor at its source offset, so the file has the source's length but only the needed bytes
take disk. ``slicing.write_slice`` then cuts the slice from it exactly as from the source (same
bytes, same slice hash), and the sparse copy is deleted: the node stores its range once, as the
slice (plus a head's embedding table). Every piece is checked against the signed manifest before
it is written; the sparse copy keeps a ``.partial`` name, so an interrupted or disk-full run
never leaves a file that looks complete, and a rerun keeps the pieces that still verify.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from meshnet.artifact.cache import ShardFiles, SliceCache
from meshnet.artifact.gguf_file import parse_gguf
from meshnet.artifact.manifest import ArtifactEntry, Manifest, ManifestError, needed_artifacts
from meshnet.artifact.pieces import piece_count, piece_span
from meshnet.core.errors import ArtifactError, FailedPrecondition, IntegrityError
from meshnet.core.layers import LayerRange


class PieceRejected(IntegrityError):
    """A piece whose sha256 is not the manifest's: the holder that sent it is not to be trusted."""

    code = "piece_rejected"


class DiskFull(FailedPrecondition):
    """Writing a verified piece failed for lack of space; nothing that looks complete was left."""

    code = "disk_full"


@dataclass(frozen=True)
class PieceRef:
    """One piece of one artifact: what a fetcher asks a holder for."""

    artifact: str
    index: int
    offset: int
    length: int
    sha256: str


def pieces_of(entry: ArtifactEntry) -> tuple[PieceRef, ...]:
    return tuple(
        PieceRef(entry.sha256, index, *piece_span(index, entry.size, entry.piece_size), entry.pieces[index])
        for index in range(piece_count(entry.size, entry.piece_size))
    )


class SliceBuilder:
    """The sparse source copy of one (manifest, range), its placed pieces, and the final cut."""

    def __init__(self, manifest: Manifest, layers: LayerRange, work_dir: Path) -> None:
        self.manifest = manifest
        self.layers = layers
        self.needed = needed_artifacts(manifest, layers)
        Path(work_dir).mkdir(parents=True, exist_ok=True)
        name = f"{manifest.source.sha256[:16]}-{layers.start}-{layers.stop}.source.partial"
        self.path = Path(work_dir) / name
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # One assembler per file: two fetches of one range on one machine would interleave.
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise FailedPrecondition(f"{self.path} is being assembled by another process") from None
        try:
            os.ftruncate(self._fd, manifest.source.size)  # a hole: no disk until pieces land
        except OSError as error:
            os.close(self._fd)
            raise DiskFull(f"cannot size {self.path.name}: {error.strerror or error}") from None
        self._extents: dict[str, list[tuple[int, int, int]]] = {}
        header = manifest.of_kind("metadata")[0]
        self._extents[header.sha256] = [(0, 0, header.size)]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> SliceBuilder:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def header_pieces(self) -> tuple[PieceRef, ...]:
        return pieces_of(self.manifest.of_kind("metadata")[0])

    def body_pieces(self) -> tuple[PieceRef, ...]:
        """Every piece of the needed tensor artifacts (place the header and ``locate_tensors`` first)."""
        return tuple(piece for entry in self.needed if entry.kind != "metadata" for piece in pieces_of(entry))

    def place(self, piece: PieceRef, data: bytes) -> None:
        """Verify ``data`` against the manifest and write it where the source holds it."""
        if len(data) != piece.length or hashlib.sha256(data).hexdigest() != piece.sha256:
            raise PieceRejected(f"piece {piece.index} of artifact {piece.artifact[:12]}… does not match the manifest")
        try:
            for file_offset, start, length in self._segments(piece):
                os.pwrite(self._fd, data[start - piece.offset : start - piece.offset + length], file_offset)
        except OSError as error:
            raise DiskFull(f"cannot write {self.path.name}: {error.strerror or error}") from None

    def missing(self, pieces: tuple[PieceRef, ...]) -> tuple[PieceRef, ...]:
        """The pieces whose bytes in the sparse copy do not (yet) verify: what a resume fetches."""
        return tuple(p for p in pieces if hashlib.sha256(self.read(p)).hexdigest() != p.sha256)

    def locate_tensors(self) -> None:
        """Map every needed artifact's bytes to source offsets, from the placed (verified) header."""
        model = parse_gguf(self.path)
        for entry in self.needed:
            if entry.kind == "metadata":
                continue
            extents = []
            for tensor in entry.tensors:
                info = model.tensors.get(tensor.name)
                if info is None or info.nbytes != tensor.nbytes:
                    raise ManifestError(f"the header does not hold tensor {tensor.name} as the manifest lists it")
                extents.append((model.data_offset + info.offset, tensor.offset, tensor.nbytes))
            self._extents[entry.sha256] = extents

    def _segments(self, piece: PieceRef) -> Iterator[tuple[int, int, int]]:
        """``(file offset, artifact offset, length)`` of the parts of ``piece`` in the sparse copy."""
        extents = self._extents.get(piece.artifact)
        if extents is None:
            raise ArtifactError(f"artifact {piece.artifact[:12]}… has no place yet: place the header first")
        end = piece.offset + piece.length
        for file_offset, start, length in extents:
            low, high = max(start, piece.offset), min(start + length, end)
            if low < high:
                yield file_offset + (low - start), low, high - low

    def read(self, piece: PieceRef) -> bytes:
        return b"".join(os.pread(self._fd, length, offset) for offset, _, length in self._segments(piece))

    def finish(self, cache: SliceCache) -> ShardFiles:
        """Cut the slice (and a head's embedding table) into the cache, then drop the sparse copy."""
        os.fsync(self._fd)
        files = cache.shard_files(
            self.path, self.layers, self.manifest.n_layers, source_sha256=self.manifest.source.sha256
        )
        self.close()
        self.path.unlink(missing_ok=True)
        return files


def read_published_piece(directory: Path, piece: PieceRef) -> bytes:
    """A piece from a published directory (``publish.py``'s layout)."""
    try:
        with open(Path(directory) / "artifacts" / piece.artifact, "rb") as handle:
            handle.seek(piece.offset)
            return handle.read(piece.length)
    except OSError as error:
        raise ArtifactError(f"cannot read artifact {piece.artifact[:12]}… in {directory}: {error.strerror}") from None


def assemble_from(builder: SliceBuilder, read: Callable[[PieceRef], bytes], cache: SliceCache) -> ShardFiles:
    """Place every missing piece read by ``read`` (header first), then cut the slice."""
    for piece in builder.missing(builder.header_pieces()):
        builder.place(piece, read(piece))
    builder.locate_tensors()
    for piece in builder.missing(builder.body_pieces()):
        builder.place(piece, read(piece))
    return builder.finish(cache)


def assemble_published(
    manifest: Manifest, directory: Path, layers: LayerRange, cache: SliceCache, work_dir: Path
) -> ShardFiles:
    """The slice for ``layers`` assembled from a published directory on this machine."""
    with SliceBuilder(manifest, layers, work_dir) as builder:
        return assemble_from(builder, lambda piece: read_published_piece(directory, piece), cache)
