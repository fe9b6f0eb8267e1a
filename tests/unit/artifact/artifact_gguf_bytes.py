"""Hand-assembled GGUF bytes for parser tests, written without the parser or ``gguf``'s writer.

Every field is spelled out so a test can corrupt exactly one of them (a count, a length, a type
id, an offset) and know what the parser should say. ``small_gguf()`` is a valid file with one
key of every scalar type, two arrays and three tensors (F32, Q8_0, F16); the parser tests check
it against ``gguf.GGUFReader`` so this builder cannot drift from the format.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

# GGUF metadata value type ids and ggml tensor type ids, from the GGUF specification.
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8
_FORMATS = {
    UINT8: "<B",
    INT8: "<b",
    UINT16: "<H",
    INT16: "<h",
    UINT32: "<I",
    INT32: "<i",
    FLOAT32: "<f",
    BOOL: "<?",
    UINT64: "<Q",
    INT64: "<q",
    FLOAT64: "<d",
}


def gguf_string(text: str | bytes, length: int | None = None) -> bytes:
    """A GGUF string: u64 byte length, then the bytes. ``length`` overrides the stored length."""
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw) if length is None else length) + raw


def scalar_kv(key: str, value_type: int, value: object) -> bytes:
    return gguf_string(key) + struct.pack("<I", value_type) + struct.pack(_FORMATS[value_type], value)


def string_kv(key: str, value: str | bytes) -> bytes:
    return gguf_string(key) + struct.pack("<I", STRING) + gguf_string(value)


def array_kv(key: str, item_type: int, items: list[object], count: int | None = None) -> bytes:
    """An array entry; ``count`` overrides the stored item count."""
    head = gguf_string(key) + struct.pack("<IIQ", ARRAY, item_type, len(items) if count is None else count)
    if item_type == STRING:
        return head + b"".join(gguf_string(str(item)) for item in items)
    return head + b"".join(struct.pack(_FORMATS[item_type], item) for item in items)


@dataclass
class RawTensor:
    name: str
    shape: tuple[int, ...]
    """ggml order: shape[0] is the row length."""
    ggml_type: int
    offset: int
    n_dims: int | None = None
    """Overrides the stored dimension count (the shape is still written as given)."""

    def encode(self) -> bytes:
        n_dims = len(self.shape) if self.n_dims is None else self.n_dims
        dims = b"".join(struct.pack("<Q", d) for d in self.shape)
        return (
            gguf_string(self.name) + struct.pack("<I", n_dims) + dims + struct.pack("<IQ", self.ggml_type, self.offset)
        )


@dataclass
class RawGGUF:
    kvs: list[bytes] = field(default_factory=list)
    tensors: list[RawTensor] = field(default_factory=list)
    data: bytes = b""
    magic: bytes = b"GGUF"
    version: int = 3
    n_tensors: int | None = None
    n_kv: int | None = None
    alignment: int = 32

    def encode(self) -> bytes:
        n_tensors = len(self.tensors) if self.n_tensors is None else self.n_tensors
        n_kv = len(self.kvs) if self.n_kv is None else self.n_kv
        header = self.magic + struct.pack("<IQQ", self.version, n_tensors, n_kv)
        header += b"".join(self.kvs) + b"".join(t.encode() for t in self.tensors)
        padding = -len(header) % self.alignment
        return header + b"\0" * padding + self.data


# The three tensors of the valid file: name, ggml shape, type, bytes.
F32_ELEMENTS = 8  # "a": 8 float32 = 32 bytes
Q8_0_BYTES = 2 * 34  # "b": 2 rows of one Q8_0 block (32 values -> 34 bytes)
F16_BYTES = 16 * 2  # "c": 4 x 4 float16


def small_tensors() -> list[RawTensor]:
    return [
        RawTensor("a", (F32_ELEMENTS,), GGML_F32, 0),
        RawTensor("b", (32, 2), GGML_Q8_0, 32),
        RawTensor("c", (4, 4), GGML_F16, 128),  # 32 + 68 = 100, aligned up to 128
    ]


def small_kvs() -> list[bytes]:
    return [
        string_kv("general.architecture", "llama"),
        string_kv("general.name", "tiny ✓"),
        scalar_kv("llama.block_count", UINT32, 1),
        scalar_kv("t.u8", UINT8, 200),
        scalar_kv("t.i8", INT8, -5),
        scalar_kv("t.u16", UINT16, 60000),
        scalar_kv("t.i16", INT16, -30000),
        scalar_kv("t.i32", INT32, -7),
        scalar_kv("t.f32", FLOAT32, 0.5),
        scalar_kv("t.bool", BOOL, True),
        scalar_kv("t.u64", UINT64, 1 << 40),
        scalar_kv("t.i64", INT64, -(1 << 40)),
        scalar_kv("t.f64", FLOAT64, 0.25),
        array_kv("t.strings", STRING, ["x", "yz", ""]),
        array_kv("t.ints", INT32, [1, -2, 3]),
    ]


def small_data() -> bytes:
    a = struct.pack("<8f", *range(F32_ELEMENTS))
    b = bytes(range(Q8_0_BYTES))
    c = struct.pack("<16e", *[float(i) for i in range(16)])
    return a + b + b"\0" * (128 - 32 - Q8_0_BYTES) + c


def small_gguf(**overrides: object) -> RawGGUF:
    """The valid small file; keyword arguments replace ``RawGGUF`` fields."""
    fields: dict[str, object] = {"kvs": small_kvs(), "tensors": small_tensors(), "data": small_data()}
    fields.update(overrides)
    return RawGGUF(**fields)  # type: ignore[arg-type]
