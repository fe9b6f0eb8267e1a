"""The one opener of every grpc.aio channel: direct addresses as ever, relayed ones through a relay.

``dial(address, ...)`` is what ``membership.channel.RenewingChannel`` (every pool and client),
the tracker's dial-back and the expert group open. A direct ``host:port`` gets exactly
``wire.tls.secure_or_plain_channel``. A relayed ``NODE@RELAY_HOST:PORT`` gets a normal channel to
a forwarder on a Unix socket in a folder only this user may enter (not a loopback port: another
local user could open Dial streams under this process's certificate through one), owned by that
channel and closed and removed with it: each
connection the channel makes there becomes one Dial stream to the relay, over one mTLS channel
to it that carries this process's own certificate. The inner channel still pins the node's own
TLS name, so the TLS session runs end to end with the node: the relay copies records it cannot
read, and the node's servicers see the dialer's certificate, as on a direct link.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from meshnet.core.addresses import RelayedAddress, parse_relayed
from meshnet.core.errors import MeshnetError, Unavailable
from meshnet.core.limits import MAX_FRAME_BYTES
from meshnet.relay.pump import splice_socket
from meshnet.security.identity import ANY_WORKER_NAME, RELAY_NAME
from meshnet.wire import relay_wire
from meshnet.wire.status import error_from_rpc
from meshnet.wire.tls import LinkSecurity, hop_server_name, link_options, secure_or_plain_channel

logger = logging.getLogger(__name__)

DIAL_ACCEPT_TIMEOUT_S = 3.5
"""How long a dialer waits for the relay to say the node took the connection: longer than the
relay's own wait for the node (``server.SPLICE_TIMEOUT_S``), so its typed answer comes first."""
RELAY_LINK_OPTIONS = link_options(MAX_FRAME_BYTES)
"""The channel to a relay: keepalive finds a dead relay within ~2.5 s, as on any link."""


def dial(
    address: str, security: LinkSecurity | None, server_name: str, options: list[tuple[str, Any]]
) -> grpc.aio.Channel:
    """A channel to ``address`` (``host:port`` or ``NODE@RELAY_HOST:PORT``), mTLS pinned to
    ``server_name`` when secured. Call it inside the event loop that will use the channel."""
    relayed = parse_relayed(address)
    if relayed is None:
        return secure_or_plain_channel(address, security, server_name, options)
    if server_name == ANY_WORKER_NAME:
        server_name = hop_server_name(relayed.node_id)  # the address names the node: pin exactly it
    forwarder = Forwarder(relayed, security)
    return RelayedChannel(secure_or_plain_channel(forwarder.address, security, server_name, options), forwarder)


def relay_channel(relay: str, security: LinkSecurity | None) -> grpc.aio.Channel:
    """An mTLS channel to the relay itself (pinned to the name every relay certificate carries)."""
    return secure_or_plain_channel(relay, security, RELAY_NAME, RELAY_LINK_OPTIONS)


class Forwarder:
    """``unix:PATH`` whose every accepted connection is one Dial stream to ``relayed.node_id``."""

    def __init__(self, relayed: RelayedAddress, security: LinkSecurity | None) -> None:
        loop = asyncio.get_running_loop()
        self._target = relayed.node_id
        self.folder = Path(tempfile.mkdtemp(prefix="meshnet-relay-"))  # mode 0700
        path = self.folder / "dial.sock"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen()
        self._listener.setblocking(False)
        self.address = f"unix:{path}"
        self._relay = relay_channel(relayed.relay, security)
        self._dial = relay_wire.dial_call(self._relay)
        self._connections: set[asyncio.Task[None]] = set()
        # Listening already (the socket is bound): connections wait in the backlog until it serves.
        self._serving = loop.create_task(asyncio.start_unix_server(self._connected, sock=self._listener))

    def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A plain callback: the forwarding task is this forwarder's own, so close() may cancel it
        # (asyncio 3.11 logs an error for a cancelled task it started for a coroutine callback).
        task = asyncio.create_task(self._forward(reader, writer))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        call = self._dial()
        try:
            # The relay answers once the node took the connection: a relay that is frozen or
            # black-holed (no keepalive yet on a link still opening) fails this dial here.
            accepted = await asyncio.wait_for(self._accepted(call), DIAL_ACCEPT_TIMEOUT_S)
            if accepted is grpc.aio.EOF:
                raise Unavailable(f"relay ended the dial to {self._target}")
            writer.write(relay_wire.chunk_data(accepted))
            await splice_socket(reader, writer, call)
        except (grpc.RpcError, OSError, TimeoutError, MeshnetError) as error:
            # The relay's typed refusal (not attached, a bound, revoked) said where the inner
            # call only sees its connection close (at once: it fails fast, it does not hang).
            reason = error_from_rpc(error) if isinstance(error, grpc.RpcError) else error
            logger.warning("relay dial to %s failed: %s", self._target, reason or "no answer in time")
            call.cancel()
            writer.close()

    async def _accepted(self, call: grpc.aio.StreamStreamCall) -> Any:
        await call.write(relay_wire.dial_header(self._target))
        return await call.read()

    async def close(self) -> None:
        if self._serving.done() and not self._serving.cancelled() and self._serving.exception() is None:
            self._serving.result().close()
        else:
            self._serving.cancel()
            self._listener.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        shutil.rmtree(self.folder, ignore_errors=True)
        await self._relay.close()


class RelayedChannel(grpc.aio.Channel):
    """A channel to a forwarder, that closes the forwarder with itself."""

    def __init__(self, inner: grpc.aio.Channel, forwarder: Forwarder) -> None:
        self._inner = inner
        self.forwarder = forwarder

    async def __aenter__(self) -> RelayedChannel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self, grace: float | None = None) -> None:
        try:
            await self._inner.close(grace)
        finally:
            with contextlib.suppress(Exception):
                await self.forwarder.close()

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self._inner.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await self._inner.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self._inner.channel_ready()

    def unary_unary(self, *args: Any, **kwargs: Any) -> grpc.aio.UnaryUnaryMultiCallable:
        return self._inner.unary_unary(*args, **kwargs)

    def unary_stream(self, *args: Any, **kwargs: Any) -> grpc.aio.UnaryStreamMultiCallable:
        return self._inner.unary_stream(*args, **kwargs)

    def stream_unary(self, *args: Any, **kwargs: Any) -> grpc.aio.StreamUnaryMultiCallable:
        return self._inner.stream_unary(*args, **kwargs)

    def stream_stream(self, *args: Any, **kwargs: Any) -> grpc.aio.StreamStreamMultiCallable:
        return self._inner.stream_stream(*args, **kwargs)
