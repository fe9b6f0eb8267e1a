"""Schema compatibility: unknown versions are refused by name; newer messages still decode."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from protocol_samples import LIMITS, decode_bytes, hidden_frame, token_frame

from meshnet.core.errors import InvalidArgument
from meshnet.wire.frames import SUPPORTED_SCHEMA_VERSIONS
from meshnet.wire.generated import shard_pb2 as pb
from meshnet.wire.shard_wire import frame_to_proto, result_from_proto


@pytest.mark.parametrize("version", [0, 2, 99, 2**32 - 1])
def test_unknown_schema_version_is_refused_naming_supported_versions(version: int) -> None:
    message = frame_to_proto(token_frame())
    message.header.schema_version = version
    with pytest.raises(InvalidArgument) as caught:
        decode_bytes(message.SerializeToString(), LIMITS)
    text = str(caught.value)
    assert f"version {version} is not supported" in text
    assert all(str(v) in text for v in SUPPORTED_SCHEMA_VERSIONS)


def test_schema_version_is_checked_before_anything_else() -> None:
    """A newer peer may change any other field; it must learn about the version, not a symptom."""
    message = frame_to_proto(token_frame())
    message.header.schema_version = 2
    message.header.phase = 77  # type: ignore[assignment]
    message.header.checksum ^= 1
    with pytest.raises(InvalidArgument, match="schema version 2"):
        decode_bytes(message.SerializeToString(), LIMITS)


def newer_schema_classes() -> tuple[Any, Any]:
    """The same schema plus fields a later release might add, in a pool of its own."""
    file_proto = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(file_proto)
    for message_proto in file_proto.message_type:
        if message_proto.name == "FrameHeader":
            message_proto.field.add(name="trace_id", number=40, type=9, label=1)  # string
        if message_proto.name == "StepRequest":
            message_proto.field.add(name="priority", number=41, type=13, label=1)  # uint32
        if message_proto.name == "StepResponse":
            message_proto.field.add(name="kv_bytes", number=42, type=4, label=1)  # uint64
    pool = descriptor_pool.DescriptorPool()
    for dependency in pb.DESCRIPTOR.dependencies:  # node.proto: the record GetCapability carries
        dependency_proto = descriptor_pb2.FileDescriptorProto()
        dependency.CopyToProto(dependency_proto)
        pool.Add(dependency_proto)
    pool.Add(file_proto)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("meshnet.v1.StepRequest")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName("meshnet.v1.StepResponse")),
    )


def test_newer_message_with_extra_fields_still_decodes() -> None:
    NewerStepRequest, NewerStepResponse = newer_schema_classes()
    frame = hidden_frame(rows=2)
    newer = NewerStepRequest.FromString(frame_to_proto(frame).SerializeToString())
    newer.header.trace_id = "trace-abc"
    newer.priority = 3
    raw = newer.SerializeToString()
    assert len(raw) > len(frame_to_proto(frame).SerializeToString())
    back = decode_bytes(raw, LIMITS)
    assert back.meta == frame.meta
    assert back.hidden is not None and frame.hidden is not None
    np.testing.assert_array_equal(back.hidden, frame.hidden)

    response = NewerStepResponse(session_id="s-1", step=2, next_position=9, kv_bytes=1 << 20)
    response.token.token_id = 5
    result = result_from_proto(pb.StepResponse.FromString(response.SerializeToString()))
    assert result.token_id == 5 and result.next_position == 9
