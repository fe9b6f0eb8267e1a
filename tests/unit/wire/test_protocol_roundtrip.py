"""Every shard message kind survives encode -> bytes -> decode unchanged; prefill chunking fits."""

from __future__ import annotations

import time
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from protocol_samples import LIMITS, N_EMBD, decode_bytes, hidden_frame, sample_record, token_frame

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.wire.frames import (
    FRAME_OVERHEAD_BYTES,
    SUPPORTED_SCHEMA_VERSIONS,
    CapabilityInfo,
    FrameLimits,
    HopTiming,
    SessionEnd,
    StepFrame,
    StepResult,
)
from meshnet.wire.generated import shard_pb2 as pb
from meshnet.wire.prefill import split_prefill
from meshnet.wire.shard_wire import (
    cancel_reply_to_proto,
    capability_from_proto,
    capability_to_proto,
    frame_to_proto,
    metrics_from_proto,
    metrics_to_proto,
    release_reply_to_proto,
    result_from_proto,
    result_to_proto,
    session_end_from_proto,
)

MIDDLE_LAYERS = LayerRange(4, 8)


def roundtrip(frame: StepFrame, limits: FrameLimits = LIMITS) -> StepFrame:
    return decode_bytes(frame_to_proto(frame).SerializeToString(), limits)


def assert_same_frame(a: StepFrame, b: StepFrame) -> None:
    assert a.meta == b.meta
    assert a.downstream == b.downstream
    assert a.sampling == b.sampling
    assert a.final_chunk == b.final_chunk
    for left, right in ((a.tokens, b.tokens), (a.hidden, b.hidden)):
        assert (left is None) == (right is None)
        if left is not None and right is not None:
            assert left.dtype == right.dtype
            np.testing.assert_array_equal(left, right)


def test_token_frame_roundtrip_keeps_every_field() -> None:
    frame = token_frame((5, 0, 999, 17))
    back = roundtrip(frame)
    assert_same_frame(frame, back)
    assert back.tokens is not None and back.tokens.dtype == np.int32
    assert back.n_tokens == 4
    assert back.meta.deadline_ms == 2500
    assert len(back.downstream) == 2  # 4:8 and 8:12 after a 0:4 head


def test_hidden_frame_roundtrip_is_bit_exact_and_zero_copy() -> None:
    frame = hidden_frame(rows=5, seed=3)
    message = pb.StepRequest.FromString(frame_to_proto(frame).SerializeToString())
    back = decode_bytes(message.SerializeToString(), LIMITS)
    assert_same_frame(frame, back)
    assert back.hidden is not None
    assert back.hidden.shape == (5, N_EMBD)
    # Built over the received bytes, not copied: a view that cannot be written through.
    assert not back.hidden.flags.writeable
    assert back.hidden.base is not None


def test_decode_continuation_frame_roundtrip() -> None:
    frame = hidden_frame(rows=1, opening=False, phase="decode", cache="continue", position=41, step=9, deadline_ms=None)
    back = roundtrip(frame)
    assert_same_frame(frame, back)
    assert back.downstream == () and back.sampling is None
    assert back.meta.deadline_ms is None


def test_big_endian_hidden_is_read_correctly() -> None:
    frame = hidden_frame(rows=2, seed=5)
    message = frame_to_proto(frame)
    tensor = message.hidden.tensors[0]
    assert frame.hidden is not None
    data = frame.hidden.astype(">f4").tobytes()
    tensor.byte_order = pb.BYTE_ORDER_BIG
    del tensor.fragments[:]
    tensor.fragments.extend([data[:7], data[7:]])  # fragments need not align to elements
    message.header.checksum = zlib.crc32(data)
    back = decode_bytes(message.SerializeToString(), LIMITS)
    assert back.hidden is not None and back.hidden.dtype == np.float32
    np.testing.assert_array_equal(back.hidden, frame.hidden)


def test_step_result_roundtrip_token_and_ack() -> None:
    timings = (
        HopTiming("127.0.0.1:5001", LayerRange(0, 4), queue_us=12, compute_us=3400),
        HopTiming("127.0.0.1:5002", LayerRange(4, 12), queue_us=0, compute_us=9100),
    )
    for token_id in (0, 31337, None):
        result = StepResult(SessionId("s-1"), step=4, next_position=20, token_id=token_id, timings=timings)
        raw = result_to_proto(result).SerializeToString()
        assert result_from_proto(pb.StepResponse.FromString(raw)) == result


timings = st.builds(
    HopTiming,
    address=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=30),
    layers=st.integers(0, 100).flatmap(
        lambda start: st.builds(LayerRange, st.just(start), st.integers(start + 1, 200))
    ),
    queue_us=st.integers(0, 2**63 - 1),
    compute_us=st.integers(0, 2**63 - 1),
)


@given(
    step=st.integers(0, 2**63 - 1),
    next_position=st.integers(0, 2**31),
    token_id=st.none() | st.integers(0, 2**31 - 1),
    hop_timings=st.lists(timings, max_size=8).map(tuple),
)
def test_any_step_result_roundtrips(
    step: int, next_position: int, token_id: int | None, hop_timings: tuple[HopTiming, ...]
) -> None:
    result = StepResult(SessionId("s-1"), step, next_position, token_id, hop_timings)
    assert result_from_proto(pb.StepResponse.FromString(result_to_proto(result).SerializeToString())) == result


def sample_capability(layers: LayerRange = MIDDLE_LAYERS) -> CapabilityInfo:
    return CapabilityInfo(
        node_id=NodeId("node-a"),
        record=sample_record(layers),
        schema_versions=SUPPORTED_SCHEMA_VERSIONS,
        free_sessions=6,
        active_sessions=2,
    )


@pytest.mark.parametrize("layers", [LayerRange(0, 4), LayerRange(4, 8), LayerRange(8, 12), LayerRange(0, 12)])
def test_capability_roundtrip_carries_the_nodes_record(layers: LayerRange) -> None:
    info = sample_capability(layers)
    message = capability_to_proto(info)
    assert capability_from_proto(pb.Capability.FromString(message.SerializeToString())) == info


def test_a_capability_without_its_record_or_with_more_room_than_sessions_is_refused() -> None:
    message = capability_to_proto(sample_capability())
    message.free_sessions = 9  # the record says 8 sessions
    with pytest.raises(InvalidArgument, match="free_sessions"):
        capability_from_proto(message)
    message.ClearField("record")
    with pytest.raises(InvalidArgument, match="no node record"):
        capability_from_proto(message)


def test_release_and_cancel_requests_decode_and_replies_encode() -> None:
    """Only the server side exists (meshnet's client ends sessions by closing the stream)."""
    for message in (pb.ReleaseRequest, pb.CancelRequest):
        raw = message(session_id="s-9", reason="client disconnected").SerializeToString()
        assert session_end_from_proto(message.FromString(raw)) == SessionEnd(SessionId("s-9"), "client disconnected")
    with pytest.raises(InvalidArgument):
        session_end_from_proto(pb.ReleaseRequest())
    with pytest.raises(InvalidArgument):
        session_end_from_proto(pb.CancelRequest(session_id="s-9", reason="x" * 1025))
    for freed in (True, False):
        assert pb.ReleaseResponse.FromString(release_reply_to_proto(freed).SerializeToString()).freed is freed
        assert pb.CancelResponse.FromString(cancel_reply_to_proto(freed).SerializeToString()).freed is freed


@given(
    values=st.dictionaries(
        st.text(min_size=1, max_size=40),
        st.floats(allow_nan=False, width=64),
        max_size=50,
    )
)
def test_metrics_roundtrip(values: dict[str, float]) -> None:
    raw = metrics_to_proto(values).SerializeToString()
    assert metrics_from_proto(pb.MetricsSnapshot.FromString(raw)) == values


def test_split_prefill_tokens_respects_token_and_byte_limits() -> None:
    tokens = np.arange(10, dtype=np.int32)
    chunks = split_prefill(tokens, 100, 4 << 20, max_tokens=4)
    assert [c.position for c in chunks] == [100, 104, 108]
    assert [c.final_chunk for c in chunks] == [False, False, True]
    np.testing.assert_array_equal(np.concatenate([c.payload for c in chunks]), tokens)
    assert all(np.shares_memory(c.payload, tokens) for c in chunks)


def test_split_prefill_hidden_frames_fit_the_frame_limit() -> None:
    n_embd, max_frame = 576, FRAME_OVERHEAD_BYTES + 10 * 576 * 4 + 100
    limits = FrameLimits(n_embd=n_embd, max_frame_bytes=max_frame, max_tokens_per_frame=4096)
    hidden = np.random.default_rng(1).standard_normal((37, n_embd), dtype=np.float32)
    chunks = split_prefill(hidden, 0, max_frame)
    assert [c.payload.shape[0] for c in chunks] == [10, 10, 10, 7]
    rebuilt: list[np.ndarray] = []
    for index, chunk in enumerate(chunks):
        frame = hidden_frame(
            rows=1, layers=LayerRange(4, 8), position=chunk.position, cache="new" if index == 0 else "continue", step=0
        )
        frame = StepFrame(
            meta=frame.meta,
            hidden=chunk.payload,
            downstream=frame.downstream,
            sampling=frame.sampling,
            final_chunk=chunk.final_chunk,
        )
        raw = frame_to_proto(frame).SerializeToString()
        assert len(raw) <= max_frame
        decoded = decode_bytes(raw, limits).hidden
        assert decoded is not None
        rebuilt.append(decoded)
    np.testing.assert_array_equal(np.concatenate(rebuilt), hidden)


def test_split_prefill_refuses_rows_that_cannot_fit() -> None:
    with pytest.raises(InvalidArgument, match="does not fit"):
        split_prefill(np.zeros((2, 1 << 20), dtype=np.float32), 0, FRAME_OVERHEAD_BYTES + 1024)
    with pytest.raises(InvalidArgument, match="empty"):
        split_prefill(np.zeros(0, dtype=np.int32), 0, 4 << 20)


def test_one_token_decode_frame_is_cheap() -> None:
    """A generous bound (measured: ~25 us) that catches an accidental per-element Python loop."""
    limits = FrameLimits(n_embd=576, vocab_size=49152)
    frame = token_frame((42,), opening=False, phase="decode", cache="continue", position=9, step=3)
    for _ in range(200):
        decode_bytes(frame_to_proto(frame).SerializeToString(), limits)
    count = 2000
    started = time.perf_counter()
    for _ in range(count):
        decode_bytes(frame_to_proto(frame).SerializeToString(), limits)
    per_frame = (time.perf_counter() - started) / count
    assert per_frame < 1e-3, f"{per_frame * 1e6:.0f} us per 1-token frame"
