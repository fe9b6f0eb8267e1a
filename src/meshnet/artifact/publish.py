"""Publishing: cut a source GGUF into content-addressed artifacts and a signed manifest.

``DIR/manifest.json`` plus ``DIR/artifacts/<sha256>`` for: the source header (every metadata key
and the tensor table, ``metadata``), one artifact per block (``layer``), the tensors every
slice carries (``global``, e.g. llama3 ``rope_freqs``), the token table (``token_embedding``)
and the final norm with the LM head (``output``), and the source's vocabulary-only GGUF
(``tokenizer``, ``vocab_only.py``: what a gateway serving by model id loads). Which tensor goes where is the family
adapter's answer (``architectures/``), the same one ``slicing`` uses, so a slice assembled from
artifacts (``assemble.py``) is the slice ``meshnet slice`` cuts. Tensor bytes are copied
unchanged, packed in source order; each artifact is written atomically under its own hash.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from meshnet.artifact.architectures.base import ArchitectureAdapter
from meshnet.artifact.describe import describe_model
from meshnet.artifact.gguf_file import GGUFFile, TensorInfo
from meshnet.artifact.gguf_split import merged_header, merged_size, model_sha256, open_model, tensor_views
from meshnet.artifact.hashing import partial_path
from meshnet.artifact.manifest import SCHEMA, ArtifactEntry, ArtifactKind, KvFormat, Manifest, SourceInfo, TensorEntry
from meshnet.artifact.manifest_codec import manifest_json, sign_manifest
from meshnet.artifact.pieces import PIECE_SIZE, PieceDigests, digest_stream
from meshnet.artifact.slicing import model_dimensions
from meshnet.artifact.vocab_only import write_vocab_only
from meshnet.core.errors import ArtifactError
from meshnet.security.signing import PublisherKey

MANIFEST_NAME = "manifest.json"
ARTIFACTS_DIR = "artifacts"
_COPY = 1 << 22
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class PublishOptions:
    model_id: str
    license: str
    model_version: str = "1"
    repo: str = ""
    revision: str = ""
    piece_size: int = PIECE_SIZE


@dataclass(frozen=True)
class _Group:
    kind: ArtifactKind
    layer: int | None
    tensors: tuple[TensorInfo, ...]


def artifact_path(directory: Path, sha256: str) -> Path:
    return Path(directory) / ARTIFACTS_DIR / sha256


def group_tensors(model: GGUFFile, adapter: ArchitectureAdapter, n_layers: int) -> list[_Group]:
    """The tensors of each artifact, in source order: blocks by index, then the shared parts."""
    layers: dict[int, list[TensorInfo]] = {layer: [] for layer in range(n_layers)}
    shared: dict[ArtifactKind, list[TensorInfo]] = {"global": [], "token_embedding": [], "output": []}
    for info in model.tensors.values():
        located = adapter.layer_of(info.name)
        if located is not None:
            if located[0] not in layers:
                raise ArtifactError(f"{model.path.name}: tensor {info.name} is outside the {n_layers} blocks")
            layers[located[0]].append(info)
        elif info.name == adapter.token_embedding:
            shared["token_embedding"].append(info)
        elif info.name in adapter.global_tensors:
            shared["global"].append(info)
        else:  # check_tensors leaves only output_norm and the tail tensors here
            shared["output"].append(info)
    empty = [layer for layer, tensors in layers.items() if not tensors]
    if empty or not shared["token_embedding"]:
        raise ArtifactError(f"{model.path.name}: no tensors for layers {empty} or no token embedding to publish")
    groups = [_Group("layer", layer, tuple(tensors)) for layer, tensors in layers.items()]
    return groups + [_Group(kind, None, tuple(tensors)) for kind, tensors in shared.items() if tensors]


def _write_artifact(directory: Path, chunks: Iterator[bytes], piece_size: int) -> PieceDigests:
    """Stream ``chunks`` into a partial file while hashing, fsync, then rename it to its sha256."""
    folder = Path(directory) / ARTIFACTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    partial = partial_path(folder / "artifact")
    try:
        with open(partial, "wb") as handle:

            def written() -> Iterator[bytes]:
                for chunk in chunks:
                    handle.write(chunk)
                    yield chunk

            digests = digest_stream(written(), piece_size)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, folder / digests.sha256)
    finally:
        partial.unlink(missing_ok=True)
    return digests


def _tensor_chunks(view: Callable[[TensorInfo], memoryview], tensors: tuple[TensorInfo, ...]) -> Iterator[bytes]:
    for info in tensors:
        for offset in range(0, info.nbytes, _COPY):
            # No view of the maps is held across a yield: a failed write (a full disk) must
            # not leave one exported, or closing the maps hides the real error.
            with view(info) as payload:
                chunk = bytes(payload[offset : offset + _COPY])
            yield chunk


def tokenizer_digest(model: GGUFFile) -> str:
    digest = hashlib.sha256()
    for key in sorted(k for k in model.metadata if k.startswith("tokenizer.")):
        entry = model.metadata[key]
        digest.update(f"{key}|{int(entry.type)}|{entry.item_type}|{entry.value!r}\n".encode())
    return digest.hexdigest()


def _entry(kind: ArtifactKind, layer: int | None, d: PieceDigests, tensors: tuple[TensorInfo, ...]) -> ArtifactEntry:
    offset, packed = 0, []
    for info in tensors:
        packed.append(TensorEntry(info.name, offset, info.nbytes))
        offset += info.nbytes
    return ArtifactEntry(kind, layer, d.size, d.sha256, d.piece_size, d.pieces, d.merkle_root, tuple(packed))


def _tokenizer_entry(model: GGUFFile, out: Path, piece_size: int) -> ArtifactEntry:
    """The vocabulary-only GGUF of ``model``, written under its hash like every artifact."""
    staged = partial_path(Path(out) / ARTIFACTS_DIR / "tokenizer.gguf")
    staged.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_vocab_only(model, staged)
        digests = _write_artifact(out, iter([staged.read_bytes()]), piece_size)
    finally:
        staged.unlink(missing_ok=True)
    return _entry("tokenizer", None, digests, ())


def publish(
    source: Path, out: Path, options: PublishOptions, key: PublisherKey, progress: Progress | None = None
) -> Manifest:
    """Write the artifacts and the signed manifest of ``source`` under ``out``; return the manifest.

    A gguf-split set publishes as the single file it stands for: the header artifact is the
    merged header (``gguf_split.merged_header``), so a fetcher's sparse copy is one GGUF; the
    source's identity is the set's (``model_sha256``)."""
    out = Path(out)
    model = open_model(source)
    source = model.path
    adapter, n_layers, n_embd = model_dimensions(model)
    if model.get("meshnet.slice.role") is not None:
        raise ArtifactError(f"{source.name} is already a meshnet slice; publish the source model instead")
    groups = group_tensors(model, adapter, n_layers)
    source_sha256 = model_sha256(model, None if progress is None else lambda d, t: progress("hash", d, t))
    header_bytes, source_size = _source_header(model)
    entries: list[ArtifactEntry] = []
    with tensor_views(model) as view:
        header = _write_artifact(out, iter([header_bytes]), options.piece_size)
        entries.append(_entry("metadata", None, header, ()))
        total = header.size + sum(info.nbytes for group in groups for info in group.tensors)
        for group in groups:
            digests = _write_artifact(out, _tensor_chunks(view, group.tensors), options.piece_size)
            entries.append(_entry(group.kind, group.layer, digests, group.tensors))
            if progress is not None:
                progress("publish", sum(entry.size for entry in entries), total)
    if model.get("tokenizer.ggml.model") not in (None, "none"):
        entries.append(_tokenizer_entry(model, out, options.piece_size))
    source_info = SourceInfo(source.name, options.repo, options.revision, source_sha256, source_size)
    manifest = _manifest(model, adapter, source_info, n_layers, n_embd, options, tuple(entries))
    signed = sign_manifest(manifest, key)
    partial = partial_path(out / MANIFEST_NAME)
    try:
        partial.write_bytes(manifest_json(signed))
        os.replace(partial, out / MANIFEST_NAME)
    finally:
        partial.unlink(missing_ok=True)
    return signed


def _source_header(model: GGUFFile) -> tuple[bytes, int]:
    """The header artifact's bytes and the size of the source file it heads."""
    if not model.parts:
        with open(model.path, "rb") as handle:
            return handle.read(model.data_offset), model.file_size
    header = merged_header(model)
    return header, merged_size(model, header)


def _manifest(
    model: GGUFFile,
    adapter: ArchitectureAdapter,
    source: SourceInfo,
    n_layers: int,
    n_embd: int,
    options: PublishOptions,
    artifacts: tuple[ArtifactEntry, ...],
) -> Manifest:
    described = describe_model(model.path)
    head_dim = n_embd // max(described.n_head, 1)
    key_length = int(model.get(adapter.key("attention.key_length"), head_dim))
    value_length = int(model.get(adapter.key("attention.value_length"), head_dim))
    return Manifest(
        schema=SCHEMA,
        model_id=options.model_id,
        model_version=options.model_version,
        source=source,
        license=options.license,
        architecture=adapter.name,
        adapter=adapter.label,
        quantization=described.quantization,
        n_layers=n_layers,
        n_embd=n_embd,
        tokenizer_model=str(model.get("tokenizer.ggml.model", "none")),
        tokenizer_sha256=tokenizer_digest(model),
        runtime_backends=(f"llama-cpp-python=={importlib.metadata.version('llama-cpp-python')}",),
        context_cap=described.context_length,
        # llama.cpp's default cache: f16 keys and values, one cell per position per owned layer.
        kv_format=KvFormat("llama.cpp-unified", "f16", "f16", described.n_head_kv, key_length, value_length),
        artifacts=artifacts,
    )
