"""The one channel that follows certificate renewal: every gRPC client of the tracker and of peers.

A gRPC channel presents the client certificate it was created with at every handshake it ever
makes, reconnects included, so once ``LinkSecurity.replace_node`` installs a renewed
certificate (``generation`` moves) a client must dial over a new channel or it goes on
presenting the old one until that expires and every call fails. This module is the only place
that watches ``generation``: the tracker client, the shard channel pool, the artifact holder
client and the expert group driver all dial through ``RenewingChannel``, and it opens every
channel with ``meshnet.relay.dial``: a relayed address (``NODE@RELAY_HOST:PORT``) is reached
through its relay, end to end, exactly as a direct one.

It hands out the channel of the current generation (and stubs over it). A channel it replaced
takes no new call; the calls already in flight on it finish there, and it closes as soon as
they ended (``RETIRED_GRACE_S`` at most), with it the forwarder of a relayed one (a listening
socket and a channel to the relay); ``close`` closes them all. Without security (plaintext
loopback) nothing ever renews.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import grpc.aio

from meshnet.relay.dial import dial
from meshnet.wire.tls import LinkSecurity

StubT = TypeVar("StubT")

RETIRED_GRACE_S = 600.0
"""How long calls still running on a retired channel may go on before it closes: no request
lasts longer, and those on a channel to a node that moved away end far sooner."""


class RenewingChannel:
    """A grpc.aio channel to one peer that follows certificate renewal.

    ``server_name`` is the TLS name pinned when secured (``TRACKER_NAME``, a hop's own name,
    ``ANY_WORKER_NAME``). Create it, and ask it for channels and stubs, inside the event loop
    that uses it: a renewal opens the new channel there (an aio channel belongs to one loop)."""

    def __init__(
        self,
        address: str,
        security: LinkSecurity | None,
        server_name: str,
        options: list[tuple[str, Any]] | None = None,
    ) -> None:
        self.address = address
        self._security = security
        self._server_name = server_name
        self._options = list(options or [])
        self._generation = _generation_of(security)
        self._current = self._open()
        self._stubs: dict[Callable[[grpc.aio.Channel], Any], Any] = {}
        self._retired: dict[asyncio.Task[None], grpc.aio.Channel] = {}

    def _open(self) -> grpc.aio.Channel:
        return dial(self.address, self._security, self._server_name, self._options)

    def _follow(self) -> None:
        """Move to a new channel if the certificate was renewed since the current one opened."""
        generation = _generation_of(self._security)
        if generation != self._generation:
            self._retire(self._current)
            self._current, self._generation, self._stubs = self._open(), generation, {}

    def _retire(self, channel: grpc.aio.Channel) -> None:
        closing = asyncio.get_running_loop().create_task(channel.close(RETIRED_GRACE_S))
        self._retired[closing] = channel
        closing.add_done_callback(self._closed)

    def _closed(self, closing: asyncio.Task[None]) -> None:
        self._retired.pop(closing, None)

    def channel(self) -> grpc.aio.Channel:
        """The channel made with the certificate in use now."""
        self._follow()
        return self._current

    def stub(self, make: Callable[[grpc.aio.Channel], StubT]) -> StubT:
        """``make(channel)`` (``services.TrackerStub``, ...) over the channel of the current
        certificate, made once per channel."""
        self._follow()
        stub = self._stubs.get(make)
        if stub is None:
            stub = self._stubs[make] = make(self._current)
        return stub

    async def close(self, grace: float | None = None) -> None:
        """Close every channel this one opened; calls still running get ``grace`` seconds."""
        retired, self._retired = dict(self._retired), {}
        for closing in retired:
            closing.cancel()  # their calls get this close's grace instead
        await asyncio.gather(*retired, return_exceptions=True)
        channels = [*retired.values(), self._current]
        await asyncio.gather(*(channel.close(grace) for channel in channels), return_exceptions=True)

    async def __aenter__(self) -> RenewingChannel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _generation_of(security: LinkSecurity | None) -> int:
    return 0 if security is None else security.generation
