"""Hostile node records: any value of any field, in every message that carries a record.

A record arrives in Register (from a worker), in every route hop (from the tracker), in the
status table and in GetCapability. Every field of it is set, one at a time, to values drawn from
the whole domain its proto type allows; the property: decoding either yields a valid record that
re-encodes to the same message, or raises exactly the typed error of that edge (never anything
else, never an AssertionError, so it holds under ``python -O``), and a value known to be out of
bounds is always refused.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_samples import sample_record

from meshnet.core.errors import InvalidArgument, MeshnetError, Unavailable
from meshnet.core.events import RouteHop
from meshnet.core.ids import NodeId
from meshnet.core.swarm_status import NodeStatus, NodeTable
from meshnet.core.tracking import NodeLoad, Route
from meshnet.wire import node_wire, status_wire, tracker_wire
from meshnet.wire.generated import node_pb2

FUZZ_SETTINGS = settings(
    max_examples=300,
    deadline=timedelta(seconds=1),
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _leaves(descriptor: Descriptor, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], FieldDescriptor]]:
    for field in descriptor.fields:
        if field.message_type is not None:
            yield from _leaves(field.message_type, (*prefix, field.name))
        else:
            yield (*prefix, field.name), field


LEAVES = tuple(_leaves(node_pb2.NodeRecord.DESCRIPTOR))
_TEXT = st.text(max_size=40) | st.text(min_size=250, max_size=400) | st.sampled_from(["", "a\nb", "\x00", "ab" * 32])


def _values(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_STRING:
        single: st.SearchStrategy[Any] = _TEXT
    elif field.type == FieldDescriptor.TYPE_UINT32:
        single = st.integers(0, 2**32 - 1) | st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**32 - 1])
    elif field.type == FieldDescriptor.TYPE_UINT64:
        single = st.integers(0, 2**64 - 1) | st.sampled_from([0, 1, 2**31, 2**60, 2**64 - 1])
    elif field.type == FieldDescriptor.TYPE_DOUBLE:
        single = st.floats(allow_nan=True, allow_infinity=True)
    else:
        raise AssertionError(f"no strategy for {field.full_name}")
    if field.is_repeated:
        return st.lists(single, max_size=300)
    return single


@st.composite
def mutated_records(draw: st.DrawFn) -> node_pb2.NodeRecord:
    message = node_wire.record_to_proto(sample_record())
    for _ in range(draw(st.integers(1, 3))):
        path, field = draw(st.sampled_from(LEAVES))
        target = message
        for part in path[:-1]:
            target = getattr(target, part)
        value = draw(_values(field))
        if field.is_repeated:
            del getattr(target, path[-1])[:]
            getattr(target, path[-1]).extend(value)
        else:
            setattr(target, path[-1], value)
    return message


@FUZZ_SETTINGS
@given(mutated_records())
def test_any_register_record_decodes_to_a_valid_record_or_invalid_argument(message: node_pb2.NodeRecord) -> None:
    try:
        record = node_wire.record_from_proto(message)
    except InvalidArgument:
        return
    assert node_wire.record_to_proto(record) == message


@FUZZ_SETTINGS
@given(mutated_records())
def test_a_malformed_record_in_a_route_hop_is_the_trackers_fault(message: node_pb2.NodeRecord) -> None:
    record = sample_record()
    hop = RouteHop(NodeId("a"), record.address, record.layers, record.capability)
    reply = tracker_wire.route_to_proto(Route((hop,), 1, "tiny", "Q8_0", record.fingerprint, record.layers.stop, 1.0))
    reply.hops[0].capability.CopyFrom(message.capability)
    try:
        tracker_wire.route_from_proto(reply)
    except Unavailable:
        return


@FUZZ_SETTINGS
@given(mutated_records())
def test_a_malformed_record_in_the_status_table_is_invalid_argument(message: node_pb2.NodeRecord) -> None:
    status = NodeStatus("n-1", sample_record(), NodeLoad(1, 7, 0, 0.125, (), 1 << 20, 2 << 20), 0.5)
    reply = status_wire.node_table_to_proto(NodeTable((status,), 3, 2.0, 6.0))
    reply.nodes[0].record.CopyFrom(message)
    try:
        status_wire.node_table_from_proto(reply)
    except InvalidArgument:
        return


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("capability", "n_ctx_per_session"), 0),
        (("capability", "n_ctx_per_session"), 2**31),
        (("capability", "prefill_chunk_tokens"), 0),
        (("capability", "max_tokens_per_frame"), 2**32 - 1),
        (("capability", "max_frame_bytes"), 2**64 - 1),
        (("capability", "n_embd"), 0),
        (("capability", "max_sessions"), 0),
        (("capability", "device"), "gpu"),
        (("capability", "decode_tokens_per_s"), math.inf),
        (("capability", "prefill_tokens_per_s"), -0.5),
        (("certification", "whole_sha256"), "zz" * 32),
        (("certification", "split_sha256"), ""),
        (("certification", "digest"), "ab" * 33),
        (("certification", "fingerprint"), "x" * 300),
        (("certification", "backend_version"), "bad\nversion"),
        (("hardware", "cpu_count"), 2**32 - 1),
        (("recipe", "n_embd"), 2**21),
        (("layer_stop",), 13),
    ],
)
def test_out_of_bounds_values_are_always_refused(path: tuple[str, ...], value: object) -> None:
    message = node_wire.record_to_proto(sample_record())
    target = message
    for part in path[:-1]:
        target = getattr(target, part)
    setattr(target, path[-1], value)
    with pytest.raises(InvalidArgument):
        node_wire.record_from_proto(message)


def test_decoding_raises_only_typed_errors_for_empty_messages() -> None:
    for message in (node_pb2.NodeRecord(), node_pb2.NodeCapability(), node_pb2.Certification()):
        decode = {
            node_pb2.NodeRecord: node_wire.record_from_proto,
            node_pb2.NodeCapability: node_wire.capability_from_proto,
            node_pb2.Certification: node_wire.certification_from_proto,
        }[type(message)]
        with pytest.raises(MeshnetError):
            decode(message)  # type: ignore[operator]
