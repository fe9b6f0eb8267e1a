"""``gguf-split`` sets (``NAME-00001-of-00004.gguf`` ...) opened as one model.

llama.cpp loads a set from its first part: ``split.count`` in that part's header says how many
there are, and the others are named by ``llama_split_path(prefix, no, count)`` from the prefix
``llama_split_prefix`` takes off the first part's name. Every part carries ``split.no``,
``split.count`` and ``split.tensors.count``; only the first carries the model's metadata.

``open_model`` accepts a single GGUF, the first part of a set or the directory holding one set,
checks every part and returns one ``GGUFFile`` whose tensors name the part holding their bytes
(``TensorInfo.part`` into ``GGUFFile.parts``) and whose metadata is the first part's without the
``split.*`` keys, so describe, footprint, slicing and publishing work above it unchanged. A part
that is missing, damaged, out of order or from another set is a ``SplitSetInvalid`` naming it.
"""

from __future__ import annotations

import contextlib
import mmap
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from meshnet.artifact.gguf_file import GGUFFile, PartFile, TensorInfo, copy_metadata, parse_gguf
from meshnet.artifact.hashing import file_sha256, set_sha256
from meshnet.core.errors import ArtifactError, SplitSetInvalid

SPLIT_NO = "split.no"
SPLIT_COUNT = "split.count"
SPLIT_TENSORS = "split.tensors.count"
_FIRST_PART = re.compile(r"^(?P<prefix>.+)-00001-of-(?P<count>\d{5})\.gguf$")


def split_path(prefix: str, number: int, count: int) -> str:
    """llama.cpp's ``llama_split_path``: the file name of part ``number`` (0-based) of ``count``."""
    return f"{prefix}-{number + 1:05d}-of-{count:05d}.gguf"


def split_prefix(name: str, number: int, count: int) -> str | None:
    """llama.cpp's ``llama_split_prefix``: ``name`` without its part suffix, or None when the
    name does not end in the suffix of part ``number`` of ``count``."""
    suffix = f"-{number + 1:05d}-of-{count:05d}.gguf"
    return name[: -len(suffix)] if name.endswith(suffix) and len(name) > len(suffix) else None


def first_part(path: Path) -> Path:
    """``path`` itself, or for a directory the first part of the one set it holds."""
    path = Path(path)
    if not path.is_dir():
        return path
    firsts = sorted(p for p in path.iterdir() if _FIRST_PART.match(p.name))
    if len(firsts) != 1:
        found = ", ".join(p.name for p in firsts) or "none"
        raise ArtifactError(f"{path}: a model directory must hold one gguf-split set (first parts found: {found})")
    return firsts[0]


def open_model(path: Path) -> GGUFFile:
    """A single GGUF, or every part of the set ``path`` names checked and merged into one model."""
    first = first_part(path)
    head = parse_gguf(first)
    count = head.get(SPLIT_COUNT)
    if count is None:
        if Path(path).is_dir():
            raise ArtifactError(f"{first.name} has no {SPLIT_COUNT}: it is not part of a gguf-split set")
        return head
    if not isinstance(count, int) or count < 1:
        raise SplitSetInvalid(f"{first.name}: {SPLIT_COUNT} {count!r} is not a positive integer", first.name)
    if head.get(SPLIT_NO) != 0:
        raise SplitSetInvalid(
            f"{first.name} is part {_number(head)} of a gguf-split set: give the first part (-00001-of-)", first.name
        )
    prefix = split_prefix(first.name, 0, count)
    if prefix is None:
        raise SplitSetInvalid(
            f"{first.name}: a gguf-split first part must be named {split_path('NAME', 0, count)}", first.name
        )
    parts = [head] + [_read_part(first.with_name(split_path(prefix, no, count)), no, count) for no in range(1, count)]
    return _merge(parts, head)


def _number(model: GGUFFile) -> str:
    number = model.get(SPLIT_NO)
    return str(number + 1) if isinstance(number, int) else repr(number)


def _read_part(path: Path, number: int, count: int) -> GGUFFile:
    if not path.is_file():
        raise SplitSetInvalid(f"part {number + 1} of {count} of the gguf-split set, {path.name}, is missing", path.name)
    try:
        part = parse_gguf(path)
    except ArtifactError as error:
        raise SplitSetInvalid(f"part {path.name} is damaged: {error.message}", path.name) from None
    if part.get(SPLIT_COUNT) != count or part.get(SPLIT_NO) != number:
        raise SplitSetInvalid(
            f"{path.name} says it is part {_number(part)} of {part.get(SPLIT_COUNT)!r}, not part {number + 1} of "
            f"{count}: it is out of order or from another set",
            path.name,
        )
    return part


def _merge(parts: list[GGUFFile], head: GGUFFile) -> GGUFFile:
    expected = head.get(SPLIT_TENSORS)
    tensors: dict[str, TensorInfo] = {}
    for index, part in enumerate(parts):
        if part.get(SPLIT_TENSORS) != expected:
            raise SplitSetInvalid(
                f"{part.path.name} says the set holds {part.get(SPLIT_TENSORS)!r} tensors, the first part "
                f"{expected!r}: it is from another set",
                part.path.name,
            )
        for name, info in part.tensors.items():
            if name in tensors:
                raise SplitSetInvalid(
                    f"{part.path.name} holds tensor {name!r}, which part "
                    f"{parts[tensors[name].part].path.name} holds too: it is from another set",
                    part.path.name,
                )
            tensors[name] = replace(info, part=index)
    if len(tensors) != expected:
        raise SplitSetInvalid(
            f"the parts of {head.path.name} hold {len(tensors)} tensors, not the {expected!r} the set declares",
            parts[-1].path.name,
        )
    metadata = {k: v for k, v in head.metadata.items() if not k.startswith("split.")}
    files = tuple(PartFile(p.path, p.data_offset, p.file_size) for p in parts)
    return replace(head, metadata=metadata, tensors=tensors, parts=files)


def model_sha256(model: GGUFFile, progress: Callable[[int, int], None] | None = None) -> str:
    """A model's identity: a single file's sha256, or ``set_sha256`` over the parts in order."""
    if not model.parts:
        return file_sha256(model.path, progress)
    return set_sha256([part.path for part in model.parts], progress)


def source_files(path: Path) -> tuple[Path, ...]:
    """The files whose bytes make up the model at ``path``, in order (for cache keys)."""
    if Path(path).is_file() and not _FIRST_PART.match(Path(path).name):
        return (Path(path),)  # not named as a first part: one file (its header is not read)
    return tuple(part.path for part in open_model(path).files)


@contextlib.contextmanager
def tensor_views(model: GGUFFile) -> Iterator[Callable[[TensorInfo], memoryview]]:
    """Map every file of ``model`` read-only; yield a function from a tensor to its bytes."""
    with contextlib.ExitStack() as stack:
        maps = []
        for part in model.files:
            handle = stack.enter_context(open(part.path, "rb"))
            maps.append(stack.enter_context(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)))

        def view(info: TensorInfo) -> memoryview:
            start = model.files[info.part].data_offset + info.offset
            return memoryview(maps[info.part])[start : start + info.nbytes]

        yield view


def merged_header(model: GGUFFile) -> bytes:
    """The header of the single file the set stands for, padded to its data section.

    Metadata as the first part holds it (less ``split.*``), every tensor in set order, laid out
    as ``GGUFWriter`` lays out one file: what a sparse copy of the source needs (``assemble``)."""
    writer = GGUFWriter(path=None, arch=model.architecture)
    writer.data_alignment = model.alignment
    copy_metadata(writer, model.metadata, skip=lambda key: key == "general.architecture")
    for info in model.tensors.values():
        # GGUFWriter takes numpy order (outermost first); the dtype is ignored beside raw_dtype.
        writer.add_tensor_info(
            info.name,
            tuple(reversed(info.shape)),
            np.dtype(np.float32),
            info.nbytes,
            raw_dtype=GGMLQuantizationType(info.ggml_type),
        )
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "header.gguf"
        writer.write_header_to_file(path=target)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        writer.close()
        header = target.read_bytes()
    padded = -(-len(header) // model.alignment) * model.alignment
    return header + bytes(padded - len(header))


def merged_size(model: GGUFFile, header: bytes) -> int:
    """Bytes of the single file ``merged_header`` describes."""
    return len(header) + sum(-(-t.nbytes // model.alignment) * model.alignment for t in model.tensors.values())
