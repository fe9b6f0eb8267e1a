"""Range slices: derivative GGUFs that hold only blocks A..B-1 of a source model.

Layout of a slice (see engine-notes.md, "Range slice = a derivative GGUF"):
- blocks ``blk.A..B-1`` renamed ``blk.0..``, ``block_count = B-A``, tensor bytes copied unchanged,
  so llama.cpp's kernels see exactly the source weights;
- a *head* or *middle* slice is vocabulary-less: ``tokenizer.ggml.model = "none"``,
  ``vocab_size = 1``, a 1-row placeholder embedding and a ones ``output_norm``. llama.cpp then never
  allocates a vocabulary-sized tensor; the head looks embeddings up itself from a separate
  *embedding table* file that keeps the source rows quantized (``embedding.py``);
- a *tail* slice keeps the tokenizer, ``output_norm`` and the LM head (the token embedding when
  the model ties them);
- a *full* slice (0:n) is a verified copy of the whole model.
Every slice records its provenance under ``meshnet.slice.*`` and is written atomically.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from meshnet.artifact.architectures import adapter_for
from meshnet.artifact.architectures.base import ArchitectureAdapter
from meshnet.artifact.gguf_file import GGUFFile, MetadataValue, TensorInfo, ValueType, copy_metadata, parse_gguf
from meshnet.artifact.gguf_split import model_sha256, open_model, tensor_views
from meshnet.artifact.hashing import partial_path, tensors_sha256
from meshnet.core.errors import ArtifactError, ProvenanceMismatch
from meshnet.core.layers import LayerRange

SLICER_VERSION = "2"
SliceRole = Literal["full", "head", "middle", "tail", "embedding"]
_PROVENANCE = "meshnet.slice."
_SKIPPED_KEYS = ("general.architecture", "general.alignment")
_UNHASHED_KEYS = ("general.alignment", _PROVENANCE + "content_sha256")


@dataclass(frozen=True)
class Provenance:
    source_sha256: str
    source_n_layers: int
    layers: LayerRange
    role: SliceRole
    adapter: str
    slicer_version: str
    content_sha256: str


@dataclass(frozen=True)
class _PlannedTensor:
    name: str
    ggml_type: int
    shape: tuple[int, ...]
    source: TensorInfo | None = None
    synthetic: np.ndarray | None = None


def slice_role(layers: LayerRange, n_layers: int) -> SliceRole:
    if layers.is_head() and layers.is_tail(n_layers):
        return "full"
    if layers.is_head():
        return "head"
    return "tail" if layers.is_tail(n_layers) else "middle"


def model_dimensions(model: GGUFFile) -> tuple[ArchitectureAdapter, int, int]:
    """(adapter, n_layers, n_embd) of a source or slice, validated."""
    adapter = adapter_for(model.architecture)
    n_layers = model.require(adapter.block_count_key())
    n_embd = model.require(adapter.embedding_length_key())
    if not isinstance(n_layers, int) or not isinstance(n_embd, int) or n_layers < 1 or n_embd < 1:
        raise ArtifactError(f"{model.path.name}: block_count/embedding_length are not positive integers")
    # Fail closed before llama.cpp sees the file: unknown tensors, per-layer arrays that do not
    # match the block count, and variants the adapter refuses.
    adapter.check_tensors(list(model.tensors), model.path.name)
    adapter.check_layer_metadata(model.metadata, n_layers, model.path.name)
    adapter.refuse_source(model.metadata, n_layers, model.path.name)
    return adapter, n_layers, n_embd


def _plan_tensors(
    model: GGUFFile, adapter: ArchitectureAdapter, layers: LayerRange, role: SliceRole, n_embd: int
) -> list[_PlannedTensor]:
    planned: list[_PlannedTensor] = []
    for info in model.tensors.values():
        located = adapter.layer_of(info.name)
        if located is not None:
            layer, rest = located
            if layer in layers:
                planned.append(_PlannedTensor(f"blk.{layer - layers.start}.{rest}", info.ggml_type, info.shape, info))
        elif info.name in adapter.global_tensors:
            planned.append(_PlannedTensor(info.name, info.ggml_type, info.shape, info))
    found = {adapter.layer_of(t.name)[0] for t in planned if adapter.layer_of(t.name)}  # type: ignore[index]
    missing = [layer for layer in range(layers.start, layers.stop) if layer - layers.start not in found]
    if missing:
        raise ArtifactError(f"{model.path.name}: no tensors for layers {missing}")
    if role in ("full", "tail"):
        for name in (adapter.output_norm, *adapter.tail_tensors, adapter.token_embedding):
            kept = model.tensors.get(name)
            # token_embd goes in even when the model has a separate output.weight: llama.cpp
            # refuses to load a llama model without it. The tail never reads it (its input is
            # the boundary state), so its mmapped pages stay on disk.
            if kept is not None:
                planned.append(_PlannedTensor(name, kept.ggml_type, kept.shape, kept))
        if adapter.output_norm not in model.tensors:
            raise ArtifactError(f"{model.path.name}: the tail needs {adapter.output_norm!r}, which is missing")
    else:
        # Placeholders llama.cpp requires but never reads for embedding input: a 1-row table and a
        # ones norm. F32 so they take a few KB, not a vocabulary's worth.
        planned.append(
            _PlannedTensor(adapter.token_embedding, 0, (n_embd, 1), synthetic=np.zeros((1, n_embd), np.float32))
        )
        planned.append(_PlannedTensor(adapter.output_norm, 0, (n_embd,), synthetic=np.ones(n_embd, np.float32)))
    return planned


def _plan_metadata(
    model: GGUFFile, adapter: ArchitectureAdapter, layers: LayerRange, role: SliceRole, n_layers: int
) -> dict[str, MetadataValue]:
    metadata = {k: v for k, v in model.metadata.items() if k not in _SKIPPED_KEYS and not k.startswith(_PROVENANCE)}
    metadata = adapter.rewrite_slice_metadata(metadata, layers, n_layers)
    metadata[adapter.block_count_key()] = MetadataValue(ValueType.UINT32, len(layers))
    if role in ("head", "middle"):
        metadata = {k: v for k, v in metadata.items() if not k.startswith("tokenizer.")}
        metadata["tokenizer.ggml.model"] = MetadataValue(ValueType.STRING, "none")
        metadata[adapter.vocab_size_key()] = MetadataValue(ValueType.UINT32, 1)
    return metadata


def _payloads(planned: list[_PlannedTensor], view: Callable[[TensorInfo], memoryview]) -> Iterator[memoryview]:
    for tensor in planned:
        if tensor.source is not None:
            yield view(tensor.source)
        elif tensor.synthetic is not None:
            yield memoryview(tensor.synthetic.tobytes())


def write_slice(source: Path, layers: LayerRange, out: Path, *, source_sha256: str | None = None) -> Provenance:
    """Write the slice of ``source`` (a GGUF or a gguf-split set) for ``layers`` to ``out``
    atomically and return its provenance."""
    model = open_model(source)
    adapter, n_layers, n_embd = model_dimensions(model)
    _refuse_slice_of_slice(model)
    layers.check_within(n_layers)
    adapter.refuse_slice(layers, n_layers)
    role = slice_role(layers, n_layers)
    planned = _plan_tensors(model, adapter, layers, role, n_embd)
    metadata = _plan_metadata(model, adapter, layers, role, n_layers)
    return _write(model, adapter, planned, metadata, layers, role, n_layers, out, source_sha256)


def write_embedding_table(source: Path, out: Path, *, source_sha256: str | None = None) -> Provenance:
    """Write only the source's token embedding table, still quantized, for a head to look rows up in."""
    model = open_model(source)
    adapter, n_layers, _ = model_dimensions(model)
    _refuse_slice_of_slice(model)
    info = model.tensors.get(adapter.token_embedding)
    if info is None:
        raise ArtifactError(f"{model.path.name}: no {adapter.token_embedding!r} to take embeddings from")
    keep = ("general.", f"{adapter.name}.")
    metadata = {k: v for k, v in model.metadata.items() if k.startswith(keep) and k not in _SKIPPED_KEYS}
    planned = [_PlannedTensor(info.name, info.ggml_type, info.shape, info)]
    return _write(model, adapter, planned, metadata, LayerRange(0, n_layers), "embedding", n_layers, out, source_sha256)


def _refuse_slice_of_slice(model: GGUFFile) -> None:
    if model.get(_PROVENANCE + "role") is not None:
        raise ArtifactError(f"{model.path.name} is already a meshnet slice; slice the source model instead")


def _write(
    model: GGUFFile,
    adapter: ArchitectureAdapter,
    planned: list[_PlannedTensor],
    metadata: dict[str, MetadataValue],
    layers: LayerRange,
    role: SliceRole,
    n_layers: int,
    out: Path,
    source_sha256: str | None,
) -> Provenance:
    out = Path(out)
    source_hash = source_sha256 or model_sha256(model)
    with tensor_views(model) as view:
        tensors = tensors_sha256(
            (t.name, t.ggml_type, t.shape, payload)
            for t, payload in zip(planned, _payloads(planned, view), strict=True)
        )
        claimed = Provenance(source_hash, n_layers, layers, role, adapter.label, SLICER_VERSION, "")
        written = {
            **metadata,
            "general.architecture": MetadataValue(ValueType.STRING, adapter.name),
            **{
                _PROVENANCE + k: MetadataValue(ValueType(int(t)), v)
                for k, (t, v) in _provenance_metadata(claimed).items()
                if k != "content_sha256"
            },
        }
        provenance = replace(claimed, content_sha256=_content_hash(tensors, written))
        partial = partial_path(out)
        try:
            _emit(adapter, planned, metadata, provenance, partial, view)
            os.replace(partial, out)
        except BaseException as error:
            # The failed frames still hold views of the source mmap; drop them, or closing the
            # map raises BufferError and hides the real error (e.g. a full disk).
            traceback.clear_frames(error.__traceback__)
            raise
        finally:
            partial.unlink(missing_ok=True)
    return provenance


def _emit(
    adapter: ArchitectureAdapter,
    planned: list[_PlannedTensor],
    metadata: dict[str, MetadataValue],
    provenance: Provenance,
    path: Path,
    view: Callable[[TensorInfo], memoryview],
) -> None:
    writer = GGUFWriter(path=None, arch=adapter.name)
    copy_metadata(writer, metadata)
    for key, value in _provenance_metadata(provenance).items():
        writer.add_key_value(_PROVENANCE + key, value[1], value[0])
    for tensor in planned:
        nbytes = tensor.source.nbytes if tensor.source is not None else tensor.synthetic.nbytes  # type: ignore[union-attr]
        # GGUFWriter takes numpy order (outermost first) and reverses it into ggml order.
        writer.add_tensor_info(
            tensor.name,
            tuple(reversed(tensor.shape)),
            np.dtype(np.float32),
            nbytes,
            raw_dtype=GGMLQuantizationType(tensor.ggml_type),
        )
    writer.write_header_to_file(path=path)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for payload in _payloads(planned, view):
        writer.write_tensor_data(np.frombuffer(payload, dtype=np.uint8))
    fout = writer.fout[0] if writer.fout else None
    if fout is not None:
        fout.flush()
        os.fsync(fout.fileno())
    writer.close()


def _provenance_metadata(p: Provenance) -> dict[str, tuple[GGUFValueType, object]]:
    return {
        "source_sha256": (GGUFValueType.STRING, p.source_sha256),
        "source_n_layers": (GGUFValueType.UINT32, p.source_n_layers),
        "layer_start": (GGUFValueType.UINT32, p.layers.start),
        "layer_stop": (GGUFValueType.UINT32, p.layers.stop),
        "role": (GGUFValueType.STRING, p.role),
        "adapter": (GGUFValueType.STRING, p.adapter),
        "slicer_version": (GGUFValueType.STRING, p.slicer_version),
        "content_sha256": (GGUFValueType.STRING, p.content_sha256),
    }


def _content_hash(tensors_digest: str, metadata: dict[str, MetadataValue]) -> str:
    """One hash over the tensors and every metadata value, so a damaged hyperparameter or a
    rewritten range shows as surely as a damaged weight."""
    digest = hashlib.sha256(tensors_digest.encode())
    for key in sorted(metadata):
        if key in _UNHASHED_KEYS:
            continue
        entry = metadata[key]
        digest.update(f"{key}|{int(entry.type)}|{entry.item_type}|{entry.value!r}\n".encode())
    return digest.hexdigest()


def read_provenance(model: GGUFFile) -> Provenance:
    """The provenance a slice claims (not yet verified)."""
    try:
        return Provenance(
            source_sha256=str(model.require(_PROVENANCE + "source_sha256")),
            source_n_layers=int(model.require(_PROVENANCE + "source_n_layers")),
            layers=LayerRange(
                int(model.require(_PROVENANCE + "layer_start")), int(model.require(_PROVENANCE + "layer_stop"))
            ),
            role=model.require(_PROVENANCE + "role"),
            adapter=str(model.require(_PROVENANCE + "adapter")),
            slicer_version=str(model.require(_PROVENANCE + "slicer_version")),
            content_sha256=str(model.require(_PROVENANCE + "content_sha256")),
        )
    except ArtifactError as error:
        raise ProvenanceMismatch(f"{model.path.name} is not a meshnet slice: {error.message}") from None


def verify_slice(
    path: Path, *, layers: LayerRange | None = None, source_sha256: str | None = None, role: SliceRole | None = None
) -> tuple[GGUFFile, Provenance]:
    """Parse a slice, recompute its content hash and check it is the slice the caller expects."""
    model = parse_gguf(path)
    provenance = read_provenance(model)
    problems = []
    if layers is not None and provenance.layers != layers:
        problems.append(f"it holds layers {provenance.layers}, not {layers}")
    if source_sha256 is not None and provenance.source_sha256 != source_sha256:
        problems.append(f"it was cut from source {provenance.source_sha256[:12]}…, not {source_sha256[:12]}…")
    if role is not None and provenance.role != role:
        problems.append(f"its role is {provenance.role}, not {role}")
    if provenance.slicer_version != SLICER_VERSION:
        problems.append(f"slicer version {provenance.slicer_version} is not {SLICER_VERSION}")
    if not problems:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
            actual = tensors_sha256(
                (
                    t.name,
                    t.ggml_type,
                    t.shape,
                    memoryview(view)[model.data_offset + t.offset : model.data_offset + t.offset + t.nbytes],
                )
                for t in model.tensors.values()
            )
        if _content_hash(actual, model.metadata) != provenance.content_sha256:
            problems.append("its tensors or metadata do not match the recorded content hash (corrupt or edited)")
    if problems:
        raise ProvenanceMismatch(f"slice {Path(path).name} failed verification: " + "; ".join(problems))
    model_dimensions(model)  # an intact slice must still satisfy its adapter (e.g. per-layer arrays)
    return model, provenance
