"""relay.proto messages ↔ plain values, and the Relay service's handlers and streams.

Dial and Splice carry bytes: the relay forwards every message after a stream's first as it came
(the serialized ``RelayChunk``, never parsed nor re-encoded), so its work per crossing is one
receive and one send. Only the first message (which node, which connection) is read there. The
two ends wrap and unwrap data with ``chunk`` / ``chunk_data`` (one length prefix, no copy on read).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId, check_node_id
from meshnet.wire.generated import relay_pb2 as pb

RELAY_SERVICE = "meshnet.v1.Relay"
CHUNK_BYTES = 64 * 1024
"""The most data one Dial or Splice message carries: a TLS record is at most 16 KiB + 256, so a
chunk holds a few, and a read of the socket never waits to fill one."""
MAX_HEADER_BYTES = 512
ACCEPTED = b""
"""The relay's first message on a Dial: the node took the connection (an empty RelayChunk)."""
_DATA_TAG = 0x0A  # RelayChunk.data: field 1, length-delimited


@dataclass(frozen=True)
class ConnectionOpen:
    """The relay announces a dialer to the node it dialled (sent on the node's Attach stream)."""

    connection: int
    dialer_node_id: str


@dataclass(frozen=True)
class RelayLoadFigures:
    attached_nodes: int
    open_connections: int
    bytes_to_nodes: int
    bytes_from_nodes: int
    refused: int


def hello(node_id: str) -> pb.AttachHello:
    return pb.AttachHello(node_id=node_id)


def hello_node_id(message: pb.AttachHello) -> NodeId:
    return check_node_id(message.node_id)


def attached_event(address: str) -> pb.RelayEvent:
    return pb.RelayEvent(attached=pb.Attached(address=address))


def open_event(opened: ConnectionOpen) -> pb.RelayEvent:
    return pb.RelayEvent(open=pb.ConnectionOpen(connection=opened.connection, dialer_node_id=opened.dialer_node_id))


def read_event(message: pb.RelayEvent) -> str | ConnectionOpen:
    """The relayed address (``attached``) or a dialer to serve (``open``)."""
    kind = message.WhichOneof("event")
    if kind == "attached":
        return str(message.attached.address)
    if kind == "open":
        return ConnectionOpen(int(message.open.connection), str(message.open.dialer_node_id))
    raise InvalidArgument("the relay sent an event of no known kind")


def dial_header(target: NodeId) -> bytes:
    return pb.RelayChunk(target=target).SerializeToString()


def splice_header(connection: int) -> bytes:
    return pb.RelayChunk(connection=connection).SerializeToString()


def _header(raw: bytes) -> pb.RelayChunk:
    if len(raw) > MAX_HEADER_BYTES:
        raise InvalidArgument(f"a relay stream's first message is at most {MAX_HEADER_BYTES} bytes")
    try:
        return pb.RelayChunk.FromString(raw)
    except Exception:  # protobuf's DecodeError: hostile bytes
        raise InvalidArgument("a relay stream's first message is not a RelayChunk") from None


def read_dial_header(raw: bytes) -> NodeId:
    """The node a Dial stream asks for."""
    header = _header(raw)
    if not header.target:
        raise InvalidArgument("a Dial stream's first message must name the target node")
    return check_node_id(header.target)


def read_splice_header(raw: bytes) -> int:
    """The connection a Splice stream serves."""
    header = _header(raw)
    if not header.connection:
        raise InvalidArgument("a Splice stream's first message must name its connection")
    return int(header.connection)


def chunk(data: bytes | bytearray | memoryview) -> bytes:
    """One data message: ``RelayChunk(data=...)`` encoded by hand (a tag and a varint length)."""
    size = len(data)
    prefix = bytearray((_DATA_TAG,))
    while size >= 0x80:
        prefix.append((size & 0x7F) | 0x80)
        size >>= 7
    prefix.append(size)
    return bytes(prefix) + data


def chunk_data(raw: bytes) -> memoryview:
    """The data of one data message, without copying it; ``InvalidArgument`` for anything else."""
    view = memoryview(raw)
    if not raw:
        return view
    if raw[0] == _DATA_TAG:
        size, shift, index = 0, 0, 1
        while index < len(raw) and index < 6:
            byte = raw[index]
            index += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                if index + size == len(raw):
                    return view[index:]
                break
    raise InvalidArgument("a relay data message must hold exactly one data field")


def load_request() -> pb.RelayLoadRequest:
    return pb.RelayLoadRequest()


def load_to_proto(figures: RelayLoadFigures) -> pb.RelayLoad:
    return pb.RelayLoad(
        attached_nodes=figures.attached_nodes,
        open_connections=figures.open_connections,
        bytes_to_nodes=figures.bytes_to_nodes,
        bytes_from_nodes=figures.bytes_from_nodes,
        refused=figures.refused,
    )


def load_from_proto(message: pb.RelayLoad) -> RelayLoadFigures:
    return RelayLoadFigures(
        int(message.attached_nodes),
        int(message.open_connections),
        int(message.bytes_to_nodes),
        int(message.bytes_from_nodes),
        int(message.refused),
    )


StreamHandler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]


def relay_handler(
    *, attach: StreamHandler, splice: StreamHandler, dial: StreamHandler, load: Callable[..., Awaitable[pb.RelayLoad]]
) -> grpc.GenericRpcHandler:
    """The Relay service for a server: Attach and Load typed, Splice and Dial raw bytes."""
    return grpc.method_handlers_generic_handler(
        RELAY_SERVICE,
        {
            "Attach": grpc.stream_stream_rpc_method_handler(
                attach,
                request_deserializer=pb.AttachHello.FromString,
                response_serializer=pb.RelayEvent.SerializeToString,
            ),
            "Splice": grpc.stream_stream_rpc_method_handler(splice),
            "Dial": grpc.stream_stream_rpc_method_handler(dial),
            "Load": grpc.unary_unary_rpc_method_handler(
                load,
                request_deserializer=pb.RelayLoadRequest.FromString,
                response_serializer=pb.RelayLoad.SerializeToString,
            ),
        },
    )


def attach_call(channel: grpc.aio.Channel) -> grpc.aio.StreamStreamMultiCallable:
    return channel.stream_stream(
        f"/{RELAY_SERVICE}/Attach",
        request_serializer=pb.AttachHello.SerializeToString,
        response_deserializer=pb.RelayEvent.FromString,
    )


def splice_call(channel: grpc.aio.Channel) -> grpc.aio.StreamStreamMultiCallable:
    return channel.stream_stream(f"/{RELAY_SERVICE}/Splice")


def dial_call(channel: grpc.aio.Channel) -> grpc.aio.StreamStreamMultiCallable:
    return channel.stream_stream(f"/{RELAY_SERVICE}/Dial")


def load_call(channel: grpc.aio.Channel) -> grpc.aio.UnaryUnaryMultiCallable:
    return channel.unary_unary(
        f"/{RELAY_SERVICE}/Load",
        request_serializer=pb.RelayLoadRequest.SerializeToString,
        response_deserializer=pb.RelayLoad.FromString,
    )
