"""The relay under misuse and over time: real ``meshnet relay`` processes, real mTLS.

What must hold: a node over its byte rate is slowed down, never cut (nor are its other
connections); re-attaching does not reset a node's bounds; a stream that never says what it is
for is ended; a peer revoked while it holds a connection or an attachment loses it; a node whose
certificate is renewed attaches again with it; two processes with one node id back off instead
of replacing each other's attachment as fast as the relay answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import grpc.aio
from relay_harness import PrivateServer, RelayProcess, attached, security_of, who
from swarm_harness import Swarm, write_tiny_model

from meshnet.cli.commands.swarm import admin_security
from meshnet.core.errors import DeadlineExceeded, MeshnetError, ResourceExhausted
from meshnet.core.ids import NodeId
from meshnet.membership.channel import RenewingChannel
from meshnet.membership.tracker_client import TrackerClient
from meshnet.relay.dial import relay_channel
from meshnet.relay.load import fetch_load
from meshnet.security.certificates import mint_node
from meshnet.security.swarm_dir import load_authority
from meshnet.wire import relay_wire
from meshnet.wire.status import error_from_rpc
from meshnet.wire.tls import LinkSecurity, hop_server_name

RATE = 256 * 1024
CHUNK = relay_wire.CHUNK_BYTES


class _CountingSink:
    """The node's port as a TCP sink that counts what reached it (over all connections)."""

    def __init__(self) -> None:
        self.received = 0
        self._changed = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            self.received += len(data)
            self._changed.set()
        writer.close()

    async def until(self, count: int, timeout_s: float) -> None:
        async def reached() -> None:
            while self.received < count:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(reached(), timeout_s)


async def _open_dial(channel: grpc.aio.Channel, node_id: str) -> grpc.aio.StreamStreamCall:
    call = relay_wire.dial_call(channel)()
    await call.write(relay_wire.dial_header(NodeId(node_id)))
    assert await asyncio.wait_for(call.read(), 5) is not grpc.aio.EOF  # the node took it
    return call


async def _ended_with(call: grpc.aio.StreamStreamCall, timeout_s: float) -> MeshnetError:
    try:
        while await asyncio.wait_for(call.read(), timeout_s) is not grpc.aio.EOF:
            pass
    except grpc.RpcError as error:
        return error_from_rpc(error)
    raise AssertionError("the relay ended the stream with no error")


async def _load_until(
    relay: str, security: LinkSecurity, check: Callable[[relay_wire.RelayLoadFigures], bool], timeout_s: float = 5.0
) -> relay_wire.RelayLoadFigures:
    deadline = time.monotonic() + timeout_s
    while not check(load := await fetch_load(relay, security)):
        assert time.monotonic() < deadline, f"the relay's load stayed {load}"
        await asyncio.sleep(0.05)
    return load


async def test_a_node_over_its_byte_rate_is_slowed_down_and_none_of_its_connections_is_closed(
    tmp_path: Path,
) -> None:
    relay = RelayProcess.start(tmp_path, "relay-1", max_bytes_per_s=RATE)
    sink = _CountingSink()
    server = await asyncio.start_server(sink.serve, "127.0.0.1", 0)
    node = security_of(tmp_path, "private", "worker")
    dialer = security_of(tmp_path, "gateway", "gateway")
    try:
        async with attached([relay.address], server.sockets[0].getsockname()[1], node) as attachment:
            await attachment.address()
            async with relay_channel(relay.address, dialer) as channel:
                quiet = await _open_dial(channel, node.identity.node_id)
                burst = await _open_dial(channel, node.identity.node_id)
                started = time.monotonic()
                for _ in range(8):  # two seconds' burst: the second half goes at the rate
                    await burst.write(relay_wire.chunk(b"x" * CHUNK))
                await sink.until(8 * CHUNK, timeout_s=10)
                elapsed = time.monotonic() - started
                await quiet.write(relay_wire.chunk(b"ping"))
                await sink.until(8 * CHUNK + 4, timeout_s=5)
                assert elapsed >= 0.8, f"{8 * CHUNK} bytes crossed in {elapsed:.2f} s at {RATE} B/s"
                assert not burst.done() and not quiet.done()
                load = await fetch_load(relay.address, dialer)
                assert (load.open_connections, load.refused) == (2, 0)
                burst.cancel()
                quiet.cancel()
    finally:
        server.close()
        relay.component.stop()


async def test_re_attaching_keeps_the_nodes_connection_bound(tmp_path: Path) -> None:
    relay = RelayProcess.start(tmp_path, "relay-1", max_connections_per_node=1)
    node = security_of(tmp_path, "private", "worker")
    dialer = security_of(tmp_path, "gateway", "gateway")
    node_id = NodeId(node.identity.node_id)
    try:
        async with relay_channel(relay.address, node) as link, relay_channel(relay.address, dialer) as dials:
            first = relay_wire.attach_call(link)()
            await first.write(relay_wire.hello(node_id))
            assert isinstance(relay_wire.read_event(await first.read()), str)
            held = relay_wire.dial_call(dials)()  # waits for a Splice that never comes (2.5 s)
            await held.write(relay_wire.dial_header(node_id))
            await _load_until(relay.address, dialer, lambda load: load.open_connections == 1)
            again = relay_wire.attach_call(link)()  # the same node again: the first link ends
            await again.write(relay_wire.hello(node_id))
            assert isinstance(relay_wire.read_event(await again.read()), str)
            refused = relay_wire.dial_call(dials)()
            await refused.write(relay_wire.dial_header(node_id))
            error = await _ended_with(refused, timeout_s=5)
            assert isinstance(error, ResourceExhausted) and "--max-connections-per-node 1" in error.message
            for call in (first, held, again):
                call.cancel()
    finally:
        relay.component.stop()


async def test_a_stream_that_never_sends_its_first_message_is_ended(tmp_path: Path) -> None:
    relay = RelayProcess.start(tmp_path, "relay-1")
    node = security_of(tmp_path, "private", "worker")
    try:
        async with relay_channel(relay.address, node) as channel:
            calls = [
                relay_wire.attach_call(channel)(),
                relay_wire.dial_call(channel)(),
                relay_wire.splice_call(channel)(),
            ]
            started = time.monotonic()
            for call in calls:
                error = await _ended_with(call, timeout_s=10)
                assert isinstance(error, DeadlineExceeded) and "no first message" in error.message
            assert time.monotonic() - started < 8.0
    finally:
        relay.component.stop()


async def test_a_revoked_peer_loses_the_connection_and_the_attachment_it_holds(tmp_path: Path) -> None:
    with Swarm(tmp_path, write_tiny_model(tmp_path)) as swarm:
        tracker = swarm.start_tracker()
        relay = RelayProcess.start(tmp_path, "relay-1", tracker=tracker)
        try:
            private = PrivateServer(security_of(tmp_path, "private", "worker"))
            dialer = security_of(tmp_path, "gateway", "gateway")
            watcher = security_of(tmp_path, "watcher", "gateway")
            async with private.attached([relay.address]) as attachment:
                address = await attachment.address()
                async with RenewingChannel(address, dialer, hop_server_name(private.node_id)) as channel:
                    assert await who(channel.channel())(b"hi", timeout=10) == dialer.identity.node_id.encode() + b"|hi"
                    await _load_until(relay.address, watcher, lambda load: load.open_connections == 1)
                    async with TrackerClient(tracker, security=admin_security(tmp_path)) as admin:
                        await admin.revoke(dialer.identity.node_id)
                        # The open connection of the dialer is cut, not only its next one refused.
                        await _load_until(relay.address, watcher, lambda load: load.open_connections == 0)
                        await admin.revoke(private.node_id)
                        await _load_until(relay.address, watcher, lambda load: load.attached_nodes == 0)
        finally:
            relay.component.stop()


async def test_a_renewed_certificate_attaches_again_with_it(tmp_path: Path) -> None:
    relay = RelayProcess.start(tmp_path, "relay-1")
    try:
        security = security_of(tmp_path, "private", "worker")
        private = PrivateServer(security)
        dialer = security_of(tmp_path, "gateway", "gateway")
        async with private.attached([relay.address]) as attachment:
            address = await attachment.address()
            reported = len(attachment.addresses)
            renewed = mint_node(
                load_authority(tmp_path), node_id=private.node_id, role="worker", now_unix_s=time.time()
            )
            security.replace_node(renewed)
            deadline = time.monotonic() + 5.0
            while len(attachment.addresses) < reported + 2:  # None, then the address again
                assert time.monotonic() < deadline, "the link never attached again with the renewed certificate"
                await asyncio.sleep(0.05)
            assert attachment.addresses[reported:] == [None, address]
            assert await who_through(address, dialer, private.node_id) == dialer.identity.node_id.encode() + b"|hi"
    finally:
        relay.component.stop()


async def who_through(address: str, dialer: LinkSecurity, node_id: str) -> bytes:
    async with RenewingChannel(address, dialer, hop_server_name(node_id)) as channel:
        result: bytes = await who(channel.channel())(b"hi", timeout=10)
        return result


async def test_two_processes_with_one_node_id_back_off_instead_of_ping_ponging(tmp_path: Path) -> None:
    relay = RelayProcess.start(tmp_path, "relay-1")
    sink = await asyncio.start_server(_CountingSink().serve, "127.0.0.1", 0)
    node = security_of(tmp_path, "private", "worker")
    port = sink.sockets[0].getsockname()[1]
    try:
        async with attached([relay.address], port, node) as one, attached([relay.address], port, node) as other:
            await asyncio.sleep(3.0)
            flips = len(one.addresses) + len(other.addresses)
        # Backing off (0.5 s, doubling) a few flips each; without, one per relay round trip.
        assert flips < 24, f"{flips} address reports in 3 s"
    finally:
        sink.close()
        relay.component.stop()
