"""Hostile frames: thousands of generated malformed StepRequests, each refused with a typed error.

Every mutation below turns a valid frame into one that is invalid by construction, and names the
error it must raise. The property: decoding raises exactly a MeshnetError of that kind (never
anything else, never an AssertionError, so it holds under ``python -O``) and takes < 1 s.
"""

from __future__ import annotations

import contextlib
import math
import time
import zlib
from collections.abc import Callable
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from protocol_samples import FINGERPRINT, LIMITS, N_EMBD, decode_bytes, hidden_frame, rechecksum, token_frame

from meshnet.core.errors import IntegrityError, InvalidArgument, MeshnetError, ResourceExhausted
from meshnet.core.layers import LayerRange
from meshnet.core.tickets import MAX_SIGNER_BYTES, MAX_TICKET_BODY_BYTES
from meshnet.wire.frames import MAX_POSITION, SUPPORTED_SCHEMA_VERSIONS, StepFrame
from meshnet.wire.generated import shard_pb2 as pb
from meshnet.wire.shard_wire import frame_from_proto, frame_to_proto

FUZZ_EXAMPLES = 10_000
"""The W9 figure of the reliability design; about 13 s on 2 cores."""
FUZZ_SETTINGS = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=timedelta(seconds=1),
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

U32 = 2**32 - 1
U64 = 2**64 - 1
I32 = st.integers(-(2**31), 2**31 - 1)
Outcome = tuple[bytes, type[MeshnetError]]
Mutation = Callable[[st.DataObject, pb.StepRequest], Outcome]


@st.composite
def valid_messages(draw: st.DrawFn) -> pb.StepRequest:
    head = draw(st.booleans())
    mode = draw(st.sampled_from(["open", "chunk", "decode"]))
    rows = 1 if mode == "decode" else draw(st.integers(1, 16))
    meta = {
        "phase": "decode" if mode == "decode" else "prefill",
        "cache": "new" if mode == "open" else "continue",
        "position": 0 if mode == "open" else draw(st.integers(1, 100_000)),
        "step": draw(st.integers(0, 1000)),
    }
    if head:
        ids = tuple(draw(st.lists(st.integers(0, 999), min_size=rows, max_size=rows)))
        frame = token_frame(ids, opening=mode == "open", **meta)
    else:
        frame = hidden_frame(rows, seed=draw(st.integers(0, 1000)), opening=mode == "open", **meta)
    message = frame_to_proto(frame)
    if mode != "decode":
        message.final_chunk = draw(st.booleans())
    return message


def invalid(message: pb.StepRequest) -> Outcome:
    return message.SerializeToString(), InvalidArgument


# --- header ---------------------------------------------------------------------------------------


def bad_schema_version(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    versions = st.integers(0, U32).filter(lambda v: v not in SUPPORTED_SCHEMA_VERSIONS)
    m.header.schema_version = data.draw(versions)
    return invalid(m)


def unknown_enum(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    field, known = data.draw(st.sampled_from([("phase", {1, 2}), ("cache", {1, 2}), ("compression", {1})]))
    setattr(m.header, field, data.draw(I32.filter(lambda v: v not in known)))
    return invalid(m)


def missing_parts(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    part = data.draw(st.sampled_from(["header", "layers", "input"]))
    if part == "header":
        m.ClearField("header")
    elif part == "layers":
        m.header.ClearField("layers")
    else:
        m.ClearField("tokens")
        m.ClearField("hidden")
    return invalid(m)


def bad_layer_range(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    start = data.draw(st.integers(0, U32))
    m.header.layers.start, m.header.layers.stop = start, data.draw(st.integers(0, start))
    return invalid(m)


def bad_text(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    field = data.draw(st.sampled_from(["request_id", "session_id", "fingerprint"]))
    setattr(m.header, field, data.draw(st.sampled_from(["", "x" * 129, "é" * 5000])))
    return invalid(m)


def number_overflow(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    field = data.draw(st.sampled_from(["position", "step", "route_epoch"]))
    low = {"position": MAX_POSITION - 15 + 1, "step": 2**63, "route_epoch": 2**63}[field]
    if field == "position":
        # The last token must stay within MAX_POSITION: any start past MAX_POSITION - n + 1 fails.
        n_tokens = len(m.tokens.ids) if m.HasField("tokens") else m.hidden.tensors[0].shape[0]
        low = MAX_POSITION - n_tokens + 2
    setattr(m.header, field, data.draw(st.integers(low, U64)))
    return invalid(m)


def phase_contradictions(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    if data.draw(st.booleans()):
        m.header.phase, m.header.cache = pb.PHASE_DECODE, pb.CACHE_EXPECTATION_CONTINUE
        m.header.position = max(m.header.position, 1)
        m.final_chunk = False  # a decode step is always final: the tail must sample
    else:
        m.header.cache = pb.CACHE_EXPECTATION_NEW
        m.header.position = data.draw(st.integers(1, MAX_POSITION - 100))
    return invalid(m)


def wrong_input_for_layers(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    # Tokens only enter at layer 0; a hidden state never does.
    head = m.header.layers.start == 0
    m.header.layers.start, m.header.layers.stop = (4, 8) if head else (0, 4)
    return invalid(m)


# --- checksum -------------------------------------------------------------------------------------


def bad_checksum(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    m.header.checksum ^= data.draw(st.integers(1, U32))
    return m.SerializeToString(), IntegrityError


def damaged_payload(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    if m.HasField("tokens"):
        index = data.draw(st.integers(0, len(m.tokens.ids) - 1))
        old = m.tokens.ids[index]
        m.tokens.ids[index] = data.draw(st.integers(0, 999).filter(lambda v: v != old))
    else:
        tensor = m.hidden.tensors[0]
        raw = bytearray(tensor.fragments[0])
        bit = data.draw(st.integers(0, len(raw) * 8 - 1))
        raw[bit // 8] ^= 1 << (bit % 8)
        tensor.fragments[0] = bytes(raw)
    return m.SerializeToString(), IntegrityError


# --- tokens ---------------------------------------------------------------------------------------


def bad_tokens(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    kind = data.draw(st.sampled_from(["empty", "negative", "beyond_vocab", "too_many"]))
    m.ClearField("hidden")
    m.header.layers.start, m.header.layers.stop = 0, 4
    ids = m.tokens.ids
    del ids[:]
    if kind == "negative":
        ids.extend([1, data.draw(st.integers(-(2**31), -1)), 2])
    elif kind == "beyond_vocab":
        ids.extend([data.draw(st.integers(LIMITS.vocab_size or 0, 2**31 - 1))])
    elif kind == "too_many":
        ids.extend([5] * data.draw(st.integers(LIMITS.max_tokens_per_frame + 1, 500)))
    m.tokens.SetInParent()
    rechecksum(m)
    return invalid(m)


# --- hidden-state bundles -------------------------------------------------------------------------


def as_hidden(data: st.DataObject, m: pb.StepRequest) -> pb.NamedTensor:
    """Make ``m`` a valid hidden-state frame for layers 4:8 and return its tensor."""
    if not m.HasField("hidden"):
        rows = data.draw(st.integers(1, 4))
        frame = hidden_frame(rows, opening=False)
        m.hidden.CopyFrom(frame_to_proto(frame).hidden)
        m.header.layers.start, m.header.layers.stop = 4, 8
        m.header.phase, m.header.cache = pb.PHASE_PREFILL, pb.CACHE_EXPECTATION_CONTINUE
        m.header.position = max(m.header.position, 1)
        del m.downstream[:]
    return m.hidden.tensors[0]


def bad_shape(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    tensor = as_hidden(data, m)
    kind = data.draw(st.sampled_from(["rank", "width", "huge", "zero_rows", "too_many_rows"]))
    if kind == "rank":
        rank = data.draw(st.sampled_from([0, 1, 3, 4, 9]))
        shape = data.draw(st.lists(st.integers(0, U64), min_size=rank, max_size=rank))
    elif kind == "width":
        shape = [tensor.shape[0], data.draw(st.integers(0, U64).filter(lambda v: v != N_EMBD))]
    elif kind == "huge":
        shape = [data.draw(st.integers(2**32, U64)), data.draw(st.sampled_from([N_EMBD, U64]))]
    elif kind == "zero_rows":
        shape = [0, N_EMBD]
    else:
        shape = [data.draw(st.integers(LIMITS.max_tokens_per_frame + 1, 2**31)), N_EMBD]
    del tensor.shape[:]
    tensor.shape.extend(shape)
    return invalid(m)


def bad_element_type(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    tensor = as_hidden(data, m)
    if data.draw(st.booleans()):
        tensor.dtype = data.draw(I32.filter(lambda v: v != pb.DTYPE_FLOAT32))  # type: ignore[assignment]
    else:
        tensor.byte_order = data.draw(I32.filter(lambda v: v not in (1, 2)))  # type: ignore[assignment]
    return invalid(m)


def wrong_byte_length(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    tensor = as_hidden(data, m)
    raw = bytes(tensor.fragments[0])
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    else:
        raw += data.draw(st.binary(min_size=1, max_size=64))
    tensor.fragments[0] = raw
    rechecksum(m)
    return invalid(m)


def oversized(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    """Beyond the payload budget, or beyond the whole frame limit (the G6 case)."""
    tensor = as_hidden(data, m)
    extra = LIMITS.max_payload_bytes if data.draw(st.booleans()) else LIMITS.max_frame_bytes
    tensor.fragments.append(bytes(extra + 1))
    rechecksum(m)
    return m.SerializeToString(), ResourceExhausted


def non_finite(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    tensor = as_hidden(data, m)
    values = np.frombuffer(tensor.fragments[0], dtype="<f4").copy()
    index = data.draw(st.integers(0, values.size - 1))
    values[index] = data.draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    tensor.fragments[0] = values.tobytes()
    rechecksum(m)
    return invalid(m)


def bad_bundle(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    tensor = as_hidden(data, m)
    kind = data.draw(st.sampled_from(["version", "no_tensor", "two", "name", "no_data", "pieces"]))
    if kind == "version":
        m.hidden.bundle_version = data.draw(st.integers(0, U32).filter(lambda v: v != 1))
    elif kind == "no_tensor":
        del m.hidden.tensors[:]
    elif kind == "two":
        m.hidden.tensors.append(tensor)
    elif kind == "name":
        tensor.name = data.draw(st.text(max_size=20).filter(lambda v: v != "hidden"))
    elif kind == "no_data":
        del tensor.fragments[:]
    else:
        tensor.fragments.extend([b""] * 1100)
    rechecksum(m)
    return invalid(m)


# --- opening-frame parts --------------------------------------------------------------------------


def bad_sampling(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    spec = pb.SamplingSpec(temperature=0.5, top_k=10, top_p=0.9, seed=1)
    field, value = data.draw(
        st.sampled_from(
            [
                ("top_p", 0.0),
                ("top_p", 1.5),
                ("top_p", math.nan),
                ("temperature", math.nan),
                ("temperature", -1.0),
                ("temperature", math.inf),
                ("seed", 2**63),
                ("top_k", 2**31),
            ]
        )
    )
    setattr(spec, field, value)
    m.sampling.CopyFrom(spec)
    return invalid(m)


def bad_downstream(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    start = m.header.layers.stop
    kind = data.draw(st.sampled_from(["gap", "recipe", "address", "too_many"]))
    del m.downstream[:]
    if kind == "gap":
        hop_start = data.draw(st.integers(0, 2**20).filter(lambda v: v != start))
        m.downstream.add(
            address="127.0.0.1:1", fingerprint=FINGERPRINT, layers=pb.LayerSpan(start=hop_start, stop=hop_start + 2)
        )
    elif kind == "recipe":
        m.downstream.add(
            address="127.0.0.1:1", fingerprint="rcp-other", layers=pb.LayerSpan(start=start, stop=start + 2)
        )
    elif kind == "address":
        m.downstream.add(
            address=data.draw(st.sampled_from(["", "a" * 300])),
            fingerprint=FINGERPRINT,
            layers=pb.LayerSpan(start=start, stop=start + 2),
        )
    else:
        for index in range(LIMITS.max_hops + 1):
            m.downstream.add(
                address="127.0.0.1:1",
                fingerprint=FINGERPRINT,
                layers=pb.LayerSpan(start=start + index, stop=start + index + 1),
            )
    return invalid(m)


def bad_ticket(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    """A route ticket's parts are bounded and whole, and only an opening frame carries one."""
    opening = m.header.cache == pb.CACHE_EXPECTATION_NEW
    kinds = ["empty body", "oversized body", "signature without signer", "oversized signer"]
    kind = data.draw(st.sampled_from(kinds if opening else [*kinds, "not an opening frame"]))
    body, signature, signer = b"\x0a\x01s", b"", b""
    if kind == "empty body":
        body = b""
    elif kind == "oversized body":
        body = b"\x00" * (MAX_TICKET_BODY_BYTES + 1)
    elif kind == "signature without signer":
        signature = b"\x30" * 70
    elif kind == "oversized signer":
        signature, signer = b"\x30" * 70, b"-" * (MAX_SIGNER_BYTES + 1)
    m.ticket.body, m.ticket.signature, m.ticket.signer_certificate = body, signature, signer
    return invalid(m)


# --- bytes ----------------------------------------------------------------------------------------


def truncated(data: st.DataObject, m: pb.StepRequest) -> Outcome:
    raw = m.SerializeToString()
    essential = pb.StepRequest(header=m.header)
    if m.HasField("tokens"):
        essential.tokens.CopyFrom(m.tokens)
    else:
        essential.hidden.CopyFrom(m.hidden)
    prefix = essential.SerializeToString()
    # Fields serialize in number order, so header+input is a prefix of the full frame; any cut
    # inside it loses the header or the input, or leaves a field unterminated.
    if not raw.startswith(prefix):
        raise RuntimeError("serialization order assumption broken")
    return raw[: data.draw(st.integers(0, len(prefix) - 1))], InvalidArgument


MUTATIONS: list[Mutation] = [
    bad_schema_version,
    unknown_enum,
    missing_parts,
    bad_layer_range,
    bad_text,
    number_overflow,
    phase_contradictions,
    wrong_input_for_layers,
    bad_checksum,
    damaged_payload,
    bad_tokens,
    bad_shape,
    bad_element_type,
    wrong_byte_length,
    oversized,
    non_finite,
    bad_bundle,
    bad_sampling,
    bad_downstream,
    bad_ticket,
    truncated,
]


def decode_expecting(raw: bytes, expected: type[MeshnetError]) -> MeshnetError:
    started = time.perf_counter()
    try:
        frame = decode_bytes(raw, LIMITS)
    except MeshnetError as error:
        elapsed = time.perf_counter() - started
        if elapsed >= 1.0:
            pytest.fail(f"refusing a malformed frame took {elapsed:.2f} s")
        if not isinstance(error, expected):
            pytest.fail(f"expected {expected.__name__}, got {type(error).__name__}: {error}")
        return error
    pytest.fail(f"a malformed frame was accepted: {frame.meta}")


@FUZZ_SETTINGS
@given(data=st.data(), base=valid_messages(), mutation=st.sampled_from(MUTATIONS))
def test_malformed_frames_raise_typed_errors(data: st.DataObject, base: pb.StepRequest, mutation: Mutation) -> None:
    raw, expected = mutation(data, base)
    error = decode_expecting(raw, expected)
    event(f"{mutation.__name__} -> {type(error).__name__}")


@settings(max_examples=300, derandomize=True, database=None, deadline=timedelta(seconds=1))
@given(base=valid_messages())
def test_generated_valid_frames_decode(base: pb.StepRequest) -> None:
    """The control for the test above: unmutated frames are accepted, so refusals mean something."""
    frame = decode_bytes(base.SerializeToString(), LIMITS)
    assert frame.n_tokens >= 1


@settings(max_examples=500, derandomize=True, database=None, deadline=timedelta(seconds=1))
@given(raw=st.binary(max_size=4096))
def test_arbitrary_bytes_never_raise_anything_but_meshnet_errors(raw: bytes) -> None:
    with contextlib.suppress(MeshnetError):
        decode_bytes(raw, LIMITS)


def test_decoder_serves_the_next_valid_frame_after_garbage() -> None:
    for raw in (b"\xff" * 64, b"\x0a\x05abc", bytes(range(256))):
        with pytest.raises(InvalidArgument):
            decode_bytes(raw, LIMITS)
    frame = decode_bytes(frame_to_proto(token_frame()).SerializeToString(), LIMITS)
    assert frame.tokens is not None


# --- a few named cases, readable as documentation -------------------------------------------------


def test_checksum_mismatch_is_integrity_error_naming_both_values() -> None:
    message = frame_to_proto(hidden_frame())
    message.header.checksum = 0xDEADBEEF
    with pytest.raises(IntegrityError, match="0xdeadbeef"):
        frame_from_proto(message, LIMITS)


def test_huge_dims_are_refused_before_allocating() -> None:
    message = frame_to_proto(hidden_frame())
    tensor = message.hidden.tensors[0]
    del tensor.shape[:]
    tensor.shape.extend([U64, N_EMBD])
    with pytest.raises(InvalidArgument, match="at most 64"):
        frame_from_proto(message, LIMITS)


def test_n_embd_mismatch_names_both_widths() -> None:
    message = frame_to_proto(hidden_frame())
    tensor = message.hidden.tensors[0]
    del tensor.shape[:]
    tensor.shape.extend([3 * 2, N_EMBD // 2])  # same byte count, wrong width
    message.header.checksum = zlib.crc32(tensor.fragments[0])
    with pytest.raises(InvalidArgument, match=f"width {N_EMBD // 2}.*n_embd {N_EMBD}"):
        frame_from_proto(message, LIMITS)


def test_oversized_raw_frame_is_resource_exhausted() -> None:
    with pytest.raises(ResourceExhausted):
        decode_bytes(bytes(LIMITS.max_frame_bytes + 1), LIMITS)


def test_local_frames_validate_too() -> None:
    frame = hidden_frame()
    with pytest.raises(InvalidArgument, match="exactly one input"):
        StepFrame(meta=frame.meta, tokens=np.array([1], dtype=np.int32), hidden=frame.hidden)
    with pytest.raises(InvalidArgument, match="exactly one input"):
        StepFrame(meta=frame.meta)
    with pytest.raises(InvalidArgument, match="float32"):
        StepFrame(meta=frame.meta, hidden=np.zeros((1, N_EMBD), dtype=np.float64))
    with pytest.raises(InvalidArgument, match="layer range"):
        LayerRange(3, 3)
