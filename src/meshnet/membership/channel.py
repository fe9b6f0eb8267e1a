"""The one channel that follows certificate renewal: every gRPC client of the tracker and of peers.

A gRPC channel presents the client certificate it was created with at every handshake it ever
makes, reconnects included, so once ``LinkSecurity.replace_node`` installs a renewed
certificate (``generation`` moves) a client must dial over a new channel or it goes on
presenting the old one until that expires and every call fails. This module is the only place
that watches ``generation``:

- ``RenewingChannel`` (grpc.aio): the tracker client, the shard channel pool, the artifact
  holder client, the renew/revoke client;
- ``RenewingBlockingChannel`` (the blocking API): the expert group driver's threads.

Both hand out the channel of the current generation (and stubs over it), keep the channels
they replaced open, so calls already in flight on them finish there, and close them all in
``close``. A process renews at half its certificate's life (a day by default), so the retired
channels of one client stay few. Without security (plaintext loopback) nothing ever renews.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, Generic, TypeVar

import grpc
import grpc.aio

from meshnet.wire.tls import LinkSecurity, blocking_channel, secure_or_plain_channel

ChannelT = TypeVar("ChannelT")
StubT = TypeVar("StubT")


class _Renewing(Generic[ChannelT]):
    """The channel of the current certificate generation and the ones it replaced.

    ``server_name`` is the TLS name pinned when secured (``TRACKER_NAME``, a hop's own name,
    ``ANY_WORKER_NAME``). Thread-safe: the blocking form is used from several threads at once."""

    _open_channel: Callable[[str, LinkSecurity | None, str, list[tuple[str, Any]]], ChannelT]
    """How the form opens one channel (``secure_or_plain_channel``, ``blocking_channel``)."""

    def __init__(
        self,
        address: str,
        security: LinkSecurity | None,
        server_name: str,
        options: list[tuple[str, Any]] | None = None,
    ) -> None:
        self.address = address
        self._security = security
        self._open = partial(type(self)._open_channel, address, security, server_name, list(options or []))
        self._lock = threading.Lock()
        self._generation = _generation_of(security)
        self._current = self._open()
        self._stubs: dict[Callable[[ChannelT], Any], Any] = {}
        self._retired: list[ChannelT] = []

    def _follow(self) -> None:
        """Move to a new channel if the certificate was renewed since the current one opened."""
        generation = _generation_of(self._security)
        if generation != self._generation:
            self._retired.append(self._current)
            self._current, self._generation, self._stubs = self._open(), generation, {}

    def channel(self) -> ChannelT:
        """The channel made with the certificate in use now."""
        with self._lock:
            self._follow()
            return self._current

    def stub(self, make: Callable[[ChannelT], StubT]) -> StubT:
        """``make(channel)`` (``services.TrackerStub``, ...) over the channel of the current
        certificate, made once per channel."""
        with self._lock:
            self._follow()
            stub = self._stubs.get(make)
            if stub is None:
                stub = self._stubs[make] = make(self._current)
            return stub

    def _take_all(self) -> list[ChannelT]:
        """Every channel ever opened (to close them); the current one stays current."""
        with self._lock:
            channels, self._retired = [*self._retired, self._current], []
            return channels


def _generation_of(security: LinkSecurity | None) -> int:
    return 0 if security is None else security.generation


class RenewingChannel(_Renewing[grpc.aio.Channel]):
    """A grpc.aio channel to one peer that follows certificate renewal. Create it inside the
    event loop that uses it."""

    _open_channel = staticmethod(secure_or_plain_channel)

    async def close(self, grace: float | None = None) -> None:
        """Close every channel this one opened; calls still running get ``grace`` seconds."""
        channels = self._take_all()
        await asyncio.gather(*(channel.close(grace) for channel in channels), return_exceptions=True)

    async def __aenter__(self) -> RenewingChannel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class RenewingBlockingChannel(_Renewing[grpc.Channel]):
    """``RenewingChannel`` for the blocking gRPC API (threads): the same generation logic."""

    _open_channel = staticmethod(blocking_channel)

    def close(self) -> None:
        for channel in self._take_all():
            channel.close()
