"""Bytes between a local TCP connection and a relay stream (a Dial or a Splice), both ways.

The two ends of a relayed connection do the same thing: the dialer's forwarder pumps the inner
channel's socket into a Dial stream, the private node pumps a Splice stream into a socket to its
own gRPC port. Whichever direction ends first (EOF, a reset, the relay gone) ends both: gRPC over
TLS never half-closes, so a lone direction would only leak.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc
import grpc.aio

from meshnet.core.errors import MeshnetError
from meshnet.wire import relay_wire

logger = logging.getLogger(__name__)


async def _socket_to_stream(reader: asyncio.StreamReader, call: Any) -> None:
    while data := await reader.read(relay_wire.CHUNK_BYTES):
        await call.write(relay_wire.chunk(data))


async def _stream_to_socket(call: Any, writer: asyncio.StreamWriter) -> None:
    while (raw := await call.read()) is not grpc.aio.EOF:
        writer.write(relay_wire.chunk_data(raw))
        await writer.drain()


async def splice_socket(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, call: Any) -> None:
    """Pump until either direction ends, then close the socket and cancel the stream."""
    tasks = (
        asyncio.create_task(_socket_to_stream(reader, call)),
        asyncio.create_task(_stream_to_socket(call, writer)),
    )
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for ended in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(ended, grpc.RpcError | MeshnetError | OSError):
                logger.debug("a relayed connection ended: %s", ended)
        call.cancel()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
