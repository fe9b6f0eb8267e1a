"""Relays as real ``meshnet relay`` processes, and a private node's server for them to reach.

``RelayProcess`` starts the command from its typed config (``deploy.launch``) with an identity
of role ``relay`` minted from the test's swarm CA. ``PrivateServer`` is a real grpc.aio server
with mTLS under a worker identity, as a worker's port is: its one method answers with the node
id of the certificate the *caller* presented (read by the server's own TLS) and the bytes it got,
so a test sees both that the inner TLS session ends at the node and who it was with.
``tls_records`` reads a relay's capture file as the TLS record layer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
from swarm_harness import Component, minted_identity, start_component

from meshnet.core.ids import NodeId
from meshnet.deploy.launch.commands import relay_command
from meshnet.deploy.launch.ready_lines import RelayServerLine
from meshnet.relay.attach import attach
from meshnet.relay.config import RelayConfig
from meshnet.security.identity import Role
from meshnet.security.swarm_dir import load_identity, local_identity
from meshnet.wire.tls import LinkSecurity, bind

START_TIMEOUT_S = 30.0
WHO_METHOD = "/meshnet.test.Private/Who"


def security_of(root: Path, name: str, role: Role) -> LinkSecurity:
    """A fresh identity named ``name`` minted from ``root``'s swarm CA."""
    return LinkSecurity(load_identity(local_identity(root, name, role, time.time())))


@dataclass
class RelayProcess:
    component: Component
    address: str
    capture_dir: Path | None

    @classmethod
    def start(cls, root: Path, name: str, *, capture: bool = False, **fields: object) -> RelayProcess:
        capture_dir = root / f"{name}-capture" if capture else None
        config = RelayConfig(listen="127.0.0.1:0", capture_dir=capture_dir, **fields)  # type: ignore[arg-type]
        command = relay_command(config, root, minted_identity(root, name, "relay"))
        component = start_component(name, command, root / f"{name}.log", RelayServerLine)
        line = RelayServerLine.read(component.await_ready(time.monotonic() + START_TIMEOUT_S))
        return cls(component, line.address, capture_dir)


class PrivateServer:
    """A private node's own gRPC port: mTLS under ``security`` on 127.0.0.1, port 0."""

    def __init__(self, security: LinkSecurity) -> None:
        self.security = security
        self.node_id = NodeId(security.identity.node_id)
        self.calls = 0
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "meshnet.test.Private", {"Who": grpc.unary_unary_rpc_method_handler(self._who)}
                ),
            )
        )
        self.port = bind(self._server, "127.0.0.1:0", security)

    async def _who(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.calls += 1
        return self.security.peer(context).node_id.encode() + b"|" + request

    @contextlib.asynccontextmanager
    async def attached(self, relays: list[str]) -> AsyncIterator[Attachment]:
        """Serve, attached to ``relays`` (in order) until the block ends."""
        await self._server.start()
        try:
            async with attached(relays, self.port, self.security) as attachment:
                yield attachment
        finally:
            await self._server.stop(0)


@contextlib.asynccontextmanager
async def attached(relays: list[str], port: int, security: LinkSecurity) -> AsyncIterator[Attachment]:
    """``meshnet.relay.attach`` for the local port ``port`` until the block ends."""
    attachment = Attachment()
    task = asyncio.create_task(attach(relays, f"127.0.0.1:{port}", security, attachment.moved))
    try:
        yield attachment
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class Attachment:
    """The addresses ``attach`` reported, and a wait for the next one."""

    def __init__(self) -> None:
        self.addresses: list[str | None] = []
        self._changed = asyncio.Event()

    def moved(self, address: str | None) -> None:
        self.addresses.append(address)
        self._changed.set()

    async def address(self, timeout_s: float = 10.0, *, other_than: str | None = None) -> str:
        """The current relayed address once it is not None (nor ``other_than``)."""

        async def settled() -> str:
            while True:
                current = self.addresses[-1] if self.addresses else None
                if current is not None and current != other_than:
                    return current
                self._changed.clear()
                await self._changed.wait()

        return await asyncio.wait_for(settled(), timeout_s)


def who(channel: grpc.aio.Channel) -> grpc.aio.UnaryUnaryMultiCallable:
    return channel.unary_unary(WHO_METHOD)


def tls_records(data: bytes) -> list[tuple[int, int]]:
    """(content type, length) of each TLS record ``data`` holds; ``ValueError`` for any byte
    that is not part of a record of type 20-23 with version 0x0301 or 0x0303 (the last one may
    end early: only a header that is not a record's can fail this)."""
    records, offset = [], 0
    while offset < len(data):
        if len(data) - offset < 5:
            raise ValueError(f"{len(data) - offset} bytes at {offset} are no record header")
        kind, version, length = (
            data[offset],
            int.from_bytes(data[offset + 1 : offset + 3]),
            int.from_bytes(data[offset + 3 : offset + 5]),
        )
        if kind not in (20, 21, 22, 23) or version not in (0x0301, 0x0303) or length > 16384 + 256:
            raise ValueError(f"no TLS record at {offset}: type {kind}, version {version:#06x}, length {length}")
        # The last record may be cut short: a connection torn down while the rest was in flight.
        records.append((kind, min(length, len(data) - offset - 5)))
        offset += 5 + length
    return records
