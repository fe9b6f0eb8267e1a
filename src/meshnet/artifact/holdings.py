"""What this node holds and can serve: each artifact digest as byte extents of local files.

A seeder holds a published directory (every artifact is one whole file). A node that fetched
its range holds no artifact files at all: it stores the range once, as the slice, and serves
its artifacts from the slice's own tensor bytes (copied unchanged from the source, so a block's
artifact is the concatenation of that block's tensors in the slice). Holdings are checked
against the manifest when they are built, so a node never advertises bytes it cannot vouch for.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from meshnet.artifact.architectures import adapter_for
from meshnet.artifact.gguf_file import parse_gguf
from meshnet.artifact.manifest import ArtifactEntry, Manifest, needed_artifacts
from meshnet.artifact.manifest_codec import decode_manifest
from meshnet.artifact.publish import ARTIFACTS_DIR, MANIFEST_NAME
from meshnet.core.errors import ArtifactError, CacheMiss, InvalidArgument
from meshnet.core.layers import LayerRange

MAX_READ = 64 << 20


class ArtifactNotHeld(CacheMiss):
    """This node does not hold the artifact asked for; ask another holder."""

    code = "artifact_not_held"


@dataclass(frozen=True)
class Extent:
    path: Path
    offset: int
    length: int


@dataclass(frozen=True)
class Holdings:
    artifacts: dict[str, tuple[Extent, ...]]
    manifests: tuple[tuple[str, str], ...]
    """``(model_id, manifest sha256)`` of the manifests held (each also in ``artifacts``)."""

    def size(self, digest: str) -> int:
        return sum(extent.length for extent in self._extents(digest))

    def _extents(self, digest: str) -> tuple[Extent, ...]:
        extents = self.artifacts.get(digest)
        if extents is None:
            raise ArtifactNotHeld(f"artifact {digest[:16]}… is not held here")
        return extents

    def read(self, digest: str, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)`` of an artifact (clipped to its end)."""
        extents = self._extents(digest)
        if offset < 0 or length < 0 or length > MAX_READ:
            raise InvalidArgument(f"a read of {length} bytes at {offset} is out of bounds (at most {MAX_READ})")
        parts, position, end = [], 0, offset + length
        for extent in extents:
            low, high = max(offset, position), min(end, position + extent.length)
            if low < high:
                with open(extent.path, "rb") as handle:
                    parts.append(os.pread(handle.fileno(), high - low, extent.offset + low - position))
            position += extent.length
        return b"".join(parts)


def _hash_extents(extents: tuple[Extent, ...]) -> str:
    digest = hashlib.sha256()
    for extent in extents:
        with open(extent.path, "rb") as handle:
            handle.seek(extent.offset)
            remaining = extent.length
            while remaining:
                chunk = handle.read(min(remaining, 1 << 22))
                if not chunk:
                    break
                digest.update(chunk)
                remaining -= len(chunk)
    return digest.hexdigest()


def _checked(entry: ArtifactEntry, extents: tuple[Extent, ...]) -> tuple[Extent, ...]:
    if sum(e.length for e in extents) != entry.size or _hash_extents(extents) != entry.sha256:
        raise ArtifactError(f"the local bytes of artifact {entry.sha256[:16]}… ({entry.kind}) do not match it")
    return extents


def manifest_holding(path: Path) -> tuple[Manifest, str, Extent]:
    """The manifest file at ``path``: parsed, its digest, and its bytes as one extent."""
    data = Path(path).read_bytes()
    return decode_manifest(data), hashlib.sha256(data).hexdigest(), Extent(Path(path), 0, len(data))


def published_holdings(directory: Path) -> Holdings:
    """Everything a published directory holds, each artifact file checked against its hash."""
    manifest, digest, extent = manifest_holding(Path(directory) / MANIFEST_NAME)
    artifacts: dict[str, tuple[Extent, ...]] = {digest: (extent,)}
    for entry in manifest.artifacts:
        path = Path(directory) / ARTIFACTS_DIR / entry.sha256
        if path.exists():
            artifacts[entry.sha256] = _checked(entry, (Extent(path, 0, path.stat().st_size),))
    return Holdings(artifacts, ((manifest.model_id, digest),))


def range_holdings(
    manifest_path: Path, header: Path, slice_path: Path, embeddings: Path | None, layers: LayerRange
) -> Holdings:
    """The artifacts a node serving ``layers`` holds inside its slice (and a head's table)."""
    manifest, digest, extent = manifest_holding(manifest_path)
    artifacts: dict[str, tuple[Extent, ...]] = {digest: (extent,)}
    metadata = manifest.of_kind("metadata")[0]
    artifacts[metadata.sha256] = _checked(metadata, (Extent(Path(header), 0, metadata.size),))
    files = [parse_gguf(slice_path)] + ([parse_gguf(embeddings)] if embeddings is not None else [])
    adapter = adapter_for(manifest.architecture)
    # Only what the range needs: a head or middle slice also carries placeholders (a ones
    # output_norm, a 1-row token table) that are not the published tensors.
    for entry in needed_artifacts(manifest, layers):
        if entry.kind == "metadata":
            continue
        extents = []
        for tensor in entry.tensors:
            located = adapter.layer_of(tensor.name)
            name = tensor.name if located is None else f"blk.{located[0] - layers.start}.{located[1]}"
            found = [(f, f.tensors[name]) for f in files if name in f.tensors]
            # Only the real tensor counts: head and middle slices carry a 1-row placeholder table.
            found = [(f, info) for f, info in found if info.nbytes == tensor.nbytes]
            if (located is not None and located[0] not in layers) or not found:
                break
            model, info = found[-1]
            extents.append(Extent(model.path, model.data_offset + info.offset, info.nbytes))
        else:
            artifacts[entry.sha256] = _checked(entry, tuple(extents))
    return Holdings(artifacts, ((manifest.model_id, digest),))
