"""The bounded GGUF parser (reliability F1/F3): valid files parse exactly; every truncation and
every class of corruption is one error type, ``ArtifactError``, with a message naming the defect,
in bounded time and memory."""

from __future__ import annotations

import struct
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
from artifact_gguf_bytes import (
    ARRAY,
    BOOL,
    FLOAT32,
    GGML_F32,
    GGML_Q8_0,
    INT32,
    STRING,
    UINT32,
    RawTensor,
    array_kv,
    gguf_string,
    scalar_kv,
    small_gguf,
    small_kvs,
    small_tensors,
    string_kv,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshnet.artifact.gguf_file import GGUFFile, ValueType, parse_gguf
from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.core.errors import ArtifactError

SMALL = small_gguf().encode()


def _write(folder: Path, blob: bytes, name: str = "case.gguf") -> Path:
    path = folder / name
    path.write_bytes(blob)
    return path


def _parse_bytes(folder: Path, blob: bytes) -> GGUFFile:
    return parse_gguf(_write(folder, blob))


# -- the valid file ---------------------------------------------------------------------------


def test_small_file_parses_to_exactly_what_was_written(tmp_path: Path) -> None:
    model = _parse_bytes(tmp_path, SMALL)
    assert model.version == 3
    assert model.architecture == "llama"
    assert model.get("general.name") == "tiny ✓"
    expected_scalars = {
        "t.u8": (ValueType.UINT8, 200),
        "t.i8": (ValueType.INT8, -5),
        "t.u16": (ValueType.UINT16, 60000),
        "t.i16": (ValueType.INT16, -30000),
        "t.i32": (ValueType.INT32, -7),
        "t.f32": (ValueType.FLOAT32, 0.5),
        "t.bool": (ValueType.BOOL, True),
        "t.u64": (ValueType.UINT64, 1 << 40),
        "t.i64": (ValueType.INT64, -(1 << 40)),
        "t.f64": (ValueType.FLOAT64, 0.25),
    }
    for key, (value_type, value) in expected_scalars.items():
        assert model.metadata[key].type == value_type, key
        assert model.metadata[key].value == value, key
    assert model.metadata["t.strings"].value == ["x", "yz", ""]
    assert model.metadata["t.strings"].item_type == ValueType.STRING
    assert model.metadata["t.ints"].value == [1, -2, 3]
    assert [(t.name, t.shape, t.ggml_type, t.offset, t.nbytes) for t in model.tensors.values()] == [
        ("a", (8,), 0, 0, 32),
        ("b", (32, 2), 8, 32, 68),
        ("c", (4, 4), 1, 128, 32),
    ]
    assert model.data_offset % 32 == 0
    assert model.data_offset + 160 == model.file_size == len(SMALL)


def test_small_file_agrees_with_the_gguf_package_reader(tmp_path: Path) -> None:
    # Guards the hand-written builder: if it drifted from the format, gguf would disagree.
    path = _write(tmp_path, SMALL)
    reference = gguf.GGUFReader(path)
    ours = parse_gguf(path)
    assert reference.data_offset == ours.data_offset
    for tensor in reference.tensors:
        info = ours.tensors[tensor.name]
        assert tuple(int(d) for d in tensor.shape) == info.shape
        assert int(tensor.data_offset) == ours.data_offset + info.offset
        assert int(tensor.n_bytes) == info.nbytes
    data = SMALL[ours.data_offset :]
    assert np.frombuffer(data[:32], np.float32).tolist() == list(range(8))


def test_synthetic_model_parses(tiny_model: Path) -> None:
    model = parse_gguf(tiny_model)
    assert model.architecture == "llama"
    assert model.get("llama.block_count") == 4
    assert len(model.get("tokenizer.ggml.tokens")) == model.tensors["token_embd.weight"].shape[1]
    last = max(model.tensors.values(), key=lambda t: t.offset)
    assert model.data_offset + last.offset + last.nbytes == model.file_size


# -- corruption classes -----------------------------------------------------------------------

_KVS = small_kvs()
_TENSORS = small_tensors()


def _with_tensor(index: int, tensor: RawTensor) -> bytes:
    tensors = list(_TENSORS)
    tensors[index] = tensor
    return small_gguf(tensors=tensors).encode()


CORRUPTIONS: dict[str, tuple[bytes, str]] = {
    "bad magic": (small_gguf(magic=b"GGUG").encode(), r"bad magic"),
    "not gguf at all": (b"PK\x03\x04" + b"\0" * 64, r"bad magic"),
    "version 1": (small_gguf(version=1).encode(), r"unsupported GGUF version 1\b"),
    "version 4": (small_gguf(version=4).encode(), r"unsupported GGUF version 4\b"),
    "huge tensor count": (small_gguf(n_tensors=1 << 62).encode(), r"implausible counts: \d+ tensors"),
    "huge kv count": (small_gguf(n_kv=1 << 40).encode(), r"implausible counts: .*\d+ metadata keys"),
    "huge key length": (
        small_gguf(kvs=[gguf_string("k", length=1 << 62), *_KVS]).encode(),
        r"string length \d+ exceeds",
    ),
    "huge string value length": (
        small_gguf(
            kvs=[*_KVS, gguf_string("s") + struct.pack("<I", STRING) + gguf_string("v", length=1 << 60)]
        ).encode(),
        r"string length \d+ exceeds",
    ),
    "string value longer than the file": (
        small_gguf(kvs=[*_KVS, gguf_string("s") + struct.pack("<I", STRING) + gguf_string("v", length=5000)]).encode(),
        r"truncated",
    ),
    "tensor name longer than GGML_MAX_NAME": (
        _with_tensor(0, RawTensor("n" * 64, (8,), GGML_F32, 0)),
        r"string length 64 exceeds the limit 63",
    ),
    "invalid utf-8 key": (
        small_gguf(kvs=[*_KVS, gguf_string(b"\xff\xfe") + struct.pack("<I", UINT32) + b"\0" * 4]).encode(),
        r"not valid UTF-8",
    ),
    "invalid utf-8 string value": (small_gguf(kvs=[*_KVS, string_kv("t.s", b"\xc3\x28")]).encode(), r"not valid UTF-8"),
    "huge array count": (
        small_gguf(kvs=[*_KVS, array_kv("t.big", INT32, [1], count=1 << 60)]).encode(),
        r"array of \d+ items",
    ),
    "array count beyond the file": (
        small_gguf(kvs=[*_KVS, array_kv("t.big", INT32, [1], count=100_000)]).encode(),
        r"array of 100000 items cannot fit",
    ),
    "unknown value type": (
        small_gguf(kvs=[*_KVS, gguf_string("t.x") + struct.pack("<I", 13) + b"\0" * 8]).encode(),
        r"unknown metadata value type 13",
    ),
    "unknown array item type": (
        small_gguf(kvs=[*_KVS, gguf_string("t.x") + struct.pack("<IIQ", ARRAY, 99, 1) + b"\0" * 8]).encode(),
        r"unknown metadata value type 99",
    ),
    "nested array": (
        small_gguf(kvs=[*_KVS, gguf_string("t.x") + struct.pack("<IIQ", ARRAY, ARRAY, 1) + b"\0" * 8]).encode(),
        r"nested metadata arrays",
    ),
    "duplicate key": (small_gguf(kvs=[*_KVS, scalar_kv("t.u8", UINT32, 1)]).encode(), r"duplicate metadata key 't.u8'"),
    "alignment not a power of two": (
        small_gguf(kvs=[*_KVS, scalar_kv("general.alignment", UINT32, 24)]).encode(),
        r"alignment 24 is not a power of two",
    ),
    "alignment zero": (
        small_gguf(kvs=[*_KVS, scalar_kv("general.alignment", UINT32, 0)]).encode(),
        r"alignment 0 is not a power of two",
    ),
    "alignment of the wrong type": (
        small_gguf(kvs=[*_KVS, scalar_kv("general.alignment", FLOAT32, 32.0)]).encode(),
        r"alignment .* not a power of two",
    ),
    "unknown ggml type": (_with_tensor(0, RawTensor("a", (8,), 99, 0)), r"unknown ggml type id 99"),
    "tensor data beyond the end": (
        _with_tensor(2, RawTensor("c", (4, 4), 1, 160)),
        r"'c' data .* lies outside the file",
    ),
    "tensor offset near 2**64": (
        _with_tensor(2, RawTensor("c", (4, 4), 1, (1 << 64) - 32)),
        r"'c' data .* lies outside the file",
    ),
    "tensor larger than the file": (
        _with_tensor(2, RawTensor("c", (4096, 4096), 1, 128)),
        r"'c' data .* lies outside the file",
    ),
    "misaligned offset": (_with_tensor(2, RawTensor("c", (4, 4), 1, 130)), r"'c' data offset 130 is misaligned"),
    "duplicate tensor": (_with_tensor(2, RawTensor("b", (4, 4), 1, 128)), r"duplicate tensor 'b'"),
    "zero dimensions": (_with_tensor(0, RawTensor("a", (), GGML_F32, 0)), r"'a' has 0 dimensions"),
    "five dimensions": (_with_tensor(0, RawTensor("a", (8, 1, 1, 1, 1), GGML_F32, 0)), r"'a' has 5 dimensions"),
    "dimension count past the limit": (
        _with_tensor(0, RawTensor("a", (8,), GGML_F32, 0, n_dims=1 << 31)),
        r"'a' has \d+ dimensions",
    ),
    "empty dimension": (_with_tensor(1, RawTensor("b", (32, 0), GGML_Q8_0, 32)), r"'b' has an empty dimension"),
    "implausible element count": (
        _with_tensor(0, RawTensor("a", (1 << 32, 1 << 32), GGML_F32, 0)),
        r"'a' has an implausible \d+ elements",
    ),
    "row not a whole number of blocks": (
        _with_tensor(1, RawTensor("b", (16, 2), GGML_Q8_0, 32)),
        r"'b': row length 16 is not a multiple of the block size 32",
    ),
    "truncated tensor table": (small_gguf(n_tensors=4).encode(), r"truncated|dimensions|unknown ggml type"),
    "empty file": (b"", r"empty"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corruption_is_an_artifact_error_naming_the_problem(tmp_path: Path, case: str) -> None:
    blob, message = CORRUPTIONS[case]
    with pytest.raises(ArtifactError, match=message) as raised:
        _parse_bytes(tmp_path, blob)
    assert type(raised.value) is ArtifactError


@pytest.mark.parametrize(
    "case",
    [
        "huge tensor count",
        "huge kv count",
        "huge key length",
        "huge array count",
        "tensor larger than the file",
        "implausible element count",
    ],
)
def test_huge_claims_allocate_nothing_large(tmp_path: Path, case: str) -> None:
    path = _write(tmp_path, CORRUPTIONS[case][0])
    tracemalloc.start()
    try:
        with pytest.raises(ArtifactError):
            parse_gguf(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{case}: parser allocated {peak} bytes for a {path.stat().st_size}-byte file"


def test_missing_file_and_directory_are_artifact_errors(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="cannot read"):
        parse_gguf(tmp_path / "absent.gguf")
    with pytest.raises(ArtifactError):
        parse_gguf(tmp_path)


# -- truncation at every offset ---------------------------------------------------------------


def _assert_every_prefix_rejected(folder: Path, blob: bytes, offsets: range | list[int]) -> int:
    path = folder / "truncated.gguf"
    slowest = 0.0
    for size in offsets:
        path.write_bytes(blob[:size])
        started = time.perf_counter()
        try:
            parse_gguf(path)
        except ArtifactError as error:
            if type(error) is not ArtifactError:
                raise AssertionError(f"truncation at {size}: {type(error).__name__}, not ArtifactError") from error
        else:
            raise AssertionError(f"a file truncated to {size} of {len(blob)} bytes parsed as valid")
        slowest = max(slowest, time.perf_counter() - started)
    assert slowest < 0.5, f"one truncated parse took {slowest:.3f} s"
    return len(offsets)


def test_truncation_of_the_small_file_at_every_offset(tmp_path: Path) -> None:
    count = _assert_every_prefix_rejected(tmp_path, SMALL, range(len(SMALL)))
    assert count == len(SMALL) > 400


def test_truncation_of_a_synthetic_model_at_header_offsets(
    tmp_path: Path, synthetic_model_factory: Callable[[SyntheticSpec], Path]
) -> None:
    # One layer keeps the tensor table short enough to cover all of it.
    model_path = synthetic_model_factory(SyntheticSpec(n_layers=1))
    blob = model_path.read_bytes()
    data_offset = parse_gguf(model_path).data_offset
    table_bytes = sum(8 + len(t.name) + 4 + 8 * len(t.shape) + 4 + 8 for t in parse_gguf(model_path).tensors.values())
    assert table_bytes + 32 <= 1024, "the tensor table no longer fits the fully covered tail of the header"
    # Every offset of the fixed header and first keys, and of the tensor table and padding; the
    # vocabulary arrays between them (hundreds of look-alike strings) and the data section at
    # prime strides; every offset of the last 64 bytes (the last tensor's end is the tightest
    # bound). The small hand-built file above covers every single offset.
    offsets = sorted(
        {
            *range(1024),
            *range(data_offset - 1024, data_offset + 1),
            *range(1024, data_offset, 13),
            *range(data_offset, len(blob), 1009),
            *range(len(blob) - 64, len(blob)),
        }
    )
    _assert_every_prefix_rejected(tmp_path, blob, offsets)


# -- random damage in the header --------------------------------------------------------------

_flips = st.lists(st.tuples(st.integers(0, len(SMALL) - 160 - 1), st.integers(0, 255)), min_size=1, max_size=8)


@settings(
    max_examples=600, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(flips=_flips)
def test_random_header_damage_is_rejected_or_parsed_never_anything_else(
    tmp_path: Path, flips: list[tuple[int, int]]
) -> None:
    blob = bytearray(SMALL)
    for position, value in flips:
        blob[position] = value
    try:
        _parse_bytes(tmp_path, bytes(blob))
    except ArtifactError as error:
        assert type(error) is ArtifactError


@settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_damage_in_a_synthetic_model_header(tmp_path: Path, tiny_model: Path, data: st.DataObject) -> None:
    blob = bytearray(tiny_model.read_bytes())
    header_end = parse_gguf(tiny_model).data_offset
    for _ in range(data.draw(st.integers(1, 6))):
        # Bias toward the first kilobyte, where counts, lengths and type ids sit densest.
        position = data.draw(st.one_of(st.integers(0, 1024), st.integers(0, header_end - 1)))
        blob[position] = data.draw(st.integers(0, 255))
    try:
        model = _parse_bytes(tmp_path, bytes(blob))
    except ArtifactError as error:
        assert type(error) is ArtifactError
    else:
        assert all(model.data_offset + t.offset + t.nbytes <= model.file_size for t in model.tensors.values())


def test_builder_type_ids_are_the_parsers() -> None:
    # The value type ids the builder uses must be the parser's own, or the cases test nothing.
    assert (BOOL, STRING, ARRAY, INT32, UINT32) == (
        ValueType.BOOL,
        ValueType.STRING,
        ValueType.ARRAY,
        ValueType.INT32,
        ValueType.UINT32,
    )
