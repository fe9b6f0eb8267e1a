"""relay_wire: data chunks round-trip without a copy, first messages are checked, hostile bytes refused."""

from __future__ import annotations

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId
from meshnet.wire import relay_wire
from meshnet.wire.generated import relay_pb2


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_384, relay_wire.CHUNK_BYTES])
def test_a_chunk_is_a_relay_chunk_and_reads_back(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    raw = relay_wire.chunk(data)
    assert relay_pb2.RelayChunk.FromString(raw).data == data  # what protobuf reads too
    assert bytes(relay_wire.chunk_data(raw)) == data
    assert relay_wire.chunk_data(raw).obj is raw  # a view of the message, not a copy


@pytest.mark.parametrize(
    "raw",
    [
        b"\x0a\x05abc",
        b"\x0a\x01ab",
        b"\x12\x01a",
        b"\x0a\xff\xff\xff\xff\xff\xff",
        relay_wire.dial_header(NodeId("w-1")),
    ],
)
def test_anything_but_one_data_field_is_refused(raw: bytes) -> None:
    with pytest.raises(InvalidArgument):
        relay_wire.chunk_data(raw)


def test_headers_name_the_node_and_the_connection() -> None:
    assert relay_wire.read_dial_header(relay_wire.dial_header(NodeId("w-abc"))) == "w-abc"
    assert relay_wire.read_splice_header(relay_wire.splice_header(7)) == 7
    with pytest.raises(InvalidArgument, match="name the target"):
        relay_wire.read_dial_header(relay_wire.splice_header(7))
    with pytest.raises(InvalidArgument, match="name its connection"):
        relay_wire.read_splice_header(relay_wire.dial_header(NodeId("w-abc")))
    with pytest.raises(InvalidArgument, match="not a RelayChunk"):
        relay_wire.read_dial_header(b"\xff\xff\xff")
    with pytest.raises(InvalidArgument, match="at most"):
        relay_wire.read_dial_header(relay_wire.dial_header(NodeId("w-abc")) + relay_wire.chunk(b"x" * 600))


def test_events_round_trip() -> None:
    opened = relay_wire.ConnectionOpen(3, "g-1")
    assert relay_wire.read_event(relay_wire.open_event(opened)) == opened
    assert relay_wire.read_event(relay_wire.attached_event("w-1@127.0.0.1:7090")) == "w-1@127.0.0.1:7090"
    with pytest.raises(InvalidArgument):
        relay_wire.read_event(relay_pb2.RelayEvent())
