"""A bounded, validating GGUF header parser.

GGUF parsers have a history of overflow CVEs and the ``gguf`` package's reader trusts the file,
so everything that comes from disk or the network is parsed here first: every count, length and
offset is checked against the bytes actually present before anything is allocated. Any defect
raises ``ArtifactError`` with the byte offset, so a truncated or corrupt file is one error type.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGUFValueType, GGUFWriter

from meshnet.core.errors import ArtifactError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_TENSORS = 1 << 16
MAX_KV = 1 << 16
MAX_STRING = 1 << 24
MAX_ARRAY = 1 << 24
MAX_DIMS = 4
MAX_NAME = 64  # GGML_MAX_NAME, including the terminating NUL


class ValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_SCALAR_FORMATS = {
    ValueType.UINT8: "<B",
    ValueType.INT8: "<b",
    ValueType.UINT16: "<H",
    ValueType.INT16: "<h",
    ValueType.UINT32: "<I",
    ValueType.INT32: "<i",
    ValueType.FLOAT32: "<f",
    ValueType.BOOL: "<?",
    ValueType.UINT64: "<Q",
    ValueType.INT64: "<q",
    ValueType.FLOAT64: "<d",
}

# ggml type id -> (elements per block, bytes per block), from gguf's copy of ggml's type traits.
# An id not listed there is rejected.
GGML_BLOCKS: dict[int, tuple[int, int]] = {int(t): size for t, size in GGML_QUANT_SIZES.items()}
GGML_TYPE_NAMES: dict[int, str] = {int(t): t.name for t in GGML_QUANT_SIZES}


@dataclass(frozen=True)
class MetadataValue:
    """One key's value, with its on-disk type kept so a copy re-encodes it identically."""

    type: ValueType
    value: Any
    item_type: ValueType | None = None  # for arrays


def copy_metadata(
    writer: GGUFWriter, metadata: Mapping[str, MetadataValue], *, skip: Callable[[str], bool] = lambda key: False
) -> None:
    """Add every key of ``metadata`` (but those ``skip`` names) to ``writer`` with its on-disk
    types, so the copy re-encodes each value byte for byte as the source stored it."""
    for key, entry in metadata.items():
        if skip(key):
            continue
        sub_type = GGUFValueType(int(entry.item_type)) if entry.item_type is not None else None
        writer.add_key_value(key, entry.value, GGUFValueType(int(entry.type)), sub_type=sub_type)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    """ggml order: shape[0] is the contiguous (row) dimension."""
    ggml_type: int
    offset: int
    """Relative to the start of the data section."""
    nbytes: int
    part: int = 0
    """Index of the file holding the bytes in its model's ``parts`` (0 for a single file)."""

    @property
    def n_elements(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass(frozen=True)
class PartFile:
    """One file holding tensor bytes: its path, data-section offset and size."""

    path: Path
    data_offset: int
    file_size: int


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    version: int
    metadata: dict[str, MetadataValue]
    tensors: dict[str, TensorInfo]
    data_offset: int
    """Absolute file offset of the data section."""
    file_size: int
    parts: tuple[PartFile, ...] = ()
    """Every file of a ``gguf-split`` set in order (``gguf_split.open_model``); empty for one file."""

    @property
    def files(self) -> tuple[PartFile, ...]:
        """Where tensor bytes live: ``tensor.part`` indexes this."""
        return self.parts or (PartFile(self.path, self.data_offset, self.file_size),)

    def get(self, key: str, default: Any = None) -> Any:
        entry = self.metadata.get(key)
        return default if entry is None else entry.value

    def require(self, key: str) -> Any:
        entry = self.metadata.get(key)
        if entry is None:
            raise ArtifactError(f"{self.path.name}: required metadata key {key!r} is missing")
        return entry.value

    @property
    def architecture(self) -> str:
        arch = self.require("general.architecture")
        if not isinstance(arch, str):
            raise ArtifactError(f"{self.path.name}: general.architecture is not a string")
        return arch

    @property
    def alignment(self) -> int:
        return int(self.get("general.alignment", DEFAULT_ALIGNMENT))


def tensor_nbytes(name: str, ggml_type: int, shape: tuple[int, ...]) -> int:
    block = GGML_BLOCKS.get(ggml_type)
    if block is None:
        raise ArtifactError(f"tensor {name!r} has unknown ggml type id {ggml_type}")
    block_size, type_size = block
    if shape[0] % block_size:
        raise ArtifactError(f"tensor {name!r}: row length {shape[0]} is not a multiple of the block size {block_size}")
    rows = 1
    for dim in shape[1:]:
        rows *= dim
    return rows * (shape[0] // block_size) * type_size


class _Cursor:
    """Reads little-endian values from a buffer, refusing to step past its end."""

    def __init__(self, buffer: Any, name: str) -> None:
        self.buffer = buffer
        self.size = len(buffer)
        self.pos = 0
        self.name = name

    def fail(self, what: str) -> ArtifactError:
        return ArtifactError(f"{self.name}: {what} (at byte {self.pos} of {self.size})")

    def take(self, count: int) -> bytes:
        if count < 0 or self.pos + count > self.size:
            raise self.fail(f"truncated: needs {count} more bytes")
        chunk = bytes(self.buffer[self.pos : self.pos + count])
        self.pos += count
        return chunk

    def scalar(self, value_type: ValueType) -> Any:
        fmt = _SCALAR_FORMATS[value_type]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def u32(self) -> int:
        return int(self.scalar(ValueType.UINT32))

    def u64(self) -> int:
        return int(self.scalar(ValueType.UINT64))

    def string(self, limit: int = MAX_STRING) -> str:
        length = self.u64()
        if length > limit:
            raise self.fail(f"string length {length} exceeds the limit {limit}")
        raw = self.take(length)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail("string is not valid UTF-8") from None

    def value_type(self) -> ValueType:
        raw = self.u32()
        try:
            return ValueType(raw)
        except ValueError:
            raise self.fail(f"unknown metadata value type {raw}") from None

    def value(self, value_type: ValueType) -> MetadataValue:
        if value_type == ValueType.STRING:
            return MetadataValue(value_type, self.string())
        if value_type == ValueType.ARRAY:
            item_type = self.value_type()
            if item_type == ValueType.ARRAY:
                raise self.fail("nested metadata arrays are not supported")
            count = self.u64()
            # Every item takes at least one byte, so a count beyond the remaining bytes is a lie.
            if count > MAX_ARRAY or count > self.size - self.pos:
                raise self.fail(f"array of {count} items cannot fit in the file")
            if item_type == ValueType.STRING:
                items: list[Any] = [self.string() for _ in range(count)]
            else:
                fmt = _SCALAR_FORMATS[item_type]
                width = struct.calcsize(fmt)
                raw = self.take(width * count)
                items = list(struct.unpack("<" + fmt[1] * count, raw))
            return MetadataValue(value_type, items, item_type)
        return MetadataValue(value_type, self.scalar(value_type))


def parse_gguf(path: Path) -> GGUFFile:
    """Parse and validate the header and tensor table of ``path`` (tensor bytes are not read)."""
    path = Path(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            if size == 0:
                raise ArtifactError(f"{path.name}: file is empty, not a GGUF")
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
                return _parse(view, path, size)
    except OSError as error:
        raise ArtifactError(f"{path}: cannot read: {error.strerror or error}") from None


def _parse(buffer: Any, path: Path, size: int) -> GGUFFile:
    cursor = _Cursor(buffer, path.name)
    if cursor.take(4) != GGUF_MAGIC:
        raise ArtifactError(f"{path.name}: not a GGUF file (bad magic)")
    version = cursor.u32()
    if version not in SUPPORTED_VERSIONS:
        raise cursor.fail(f"unsupported GGUF version {version}")
    n_tensors, n_kv = cursor.u64(), cursor.u64()
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
        raise cursor.fail(f"implausible counts: {n_tensors} tensors, {n_kv} metadata keys")
    metadata: dict[str, MetadataValue] = {}
    for _ in range(n_kv):
        key = cursor.string(limit=1 << 16)
        if key in metadata:
            raise cursor.fail(f"duplicate metadata key {key!r}")
        metadata[key] = cursor.value(cursor.value_type())
    raw_infos = [_read_tensor_info(cursor) for _ in range(n_tensors)]
    alignment_value = metadata.get("general.alignment")
    alignment = DEFAULT_ALIGNMENT if alignment_value is None else alignment_value.value
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise cursor.fail(f"general.alignment {alignment!r} is not a power of two")
    data_offset = -(-cursor.pos // alignment) * alignment
    tensors: dict[str, TensorInfo] = {}
    for name, shape, ggml_type, offset in raw_infos:
        if name in tensors:
            raise ArtifactError(f"{path.name}: duplicate tensor {name!r}")
        nbytes = tensor_nbytes(name, ggml_type, shape)
        if offset % alignment:
            raise ArtifactError(
                f"{path.name}: tensor {name!r} data offset {offset} is misaligned (alignment {alignment})"
            )
        if data_offset + offset + nbytes > size:
            raise ArtifactError(
                f"{path.name}: tensor {name!r} data ({nbytes} bytes at offset {offset}) "
                f"lies outside the file ({size} bytes)"
            )
        tensors[name] = TensorInfo(name, shape, ggml_type, offset, nbytes)
    return GGUFFile(path, version, metadata, tensors, data_offset, size)


def _read_tensor_info(cursor: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    name = cursor.string(limit=MAX_NAME - 1)
    n_dims = cursor.u32()
    if not 1 <= n_dims <= MAX_DIMS:
        raise cursor.fail(f"tensor {name!r} has {n_dims} dimensions (1..{MAX_DIMS} allowed)")
    shape = tuple(cursor.u64() for _ in range(n_dims))
    elements = 1
    for dim in shape:
        if dim < 1:
            raise cursor.fail(f"tensor {name!r} has an empty dimension")
        elements *= dim
    if elements > 1 << 40:
        raise cursor.fail(f"tensor {name!r} has an implausible {elements} elements")
    return name, shape, cursor.u32(), cursor.u64()
