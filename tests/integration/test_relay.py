"""The relay end to end: real ``meshnet relay`` processes, real mTLS both outside and inside.

A private node's server (``relay_harness.PrivateServer``: mTLS under a worker identity, as a
worker's port) is attached to relays with ``meshnet.relay.attach``; a dialer reaches it at
``NODE@RELAY`` through ``RenewingChannel`` (so through ``meshnet.relay.dial``) with the node's
own pinned TLS name. What must hold: the call works and the node's server sees the *dialer's*
certificate (the TLS session is the dialer's and the node's), the relay's capture holds TLS
records only, every refusal is typed, and losing a relay moves the node to the next one.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from relay_harness import PrivateServer, RelayProcess, attached, security_of, tls_records, who
from swarm_harness import Swarm, meshnet_command, start_component, write_tiny_model

from meshnet.cli.commands.swarm import admin_security
from meshnet.core.errors import PermissionDenied, ResourceExhausted, Unauthenticated, Unavailable
from meshnet.core.ids import NodeId
from meshnet.core.limits import MAX_FRAME_BYTES
from meshnet.core.swarm_options import SecurityOptions
from meshnet.deploy.launch.commands import INSECURE, relay_command
from meshnet.deploy.launch.ready_lines import RelayServerLine
from meshnet.membership.channel import RenewingChannel
from meshnet.membership.tracker_client import TrackerClient
from meshnet.relay.attach import attach
from meshnet.relay.config import RelayConfig
from meshnet.relay.dial import RelayedChannel, dial, relay_channel
from meshnet.relay.load import fetch_load
from meshnet.route.shard_admin import fetch_metrics
from meshnet.route.shard_stream import ChannelPool
from meshnet.security.certificates import NodeCertificate, create_authority, mint_node
from meshnet.security.identity import ANY_WORKER_NAME
from meshnet.security.swarm_dir import load_identity, swarm_dir
from meshnet.wire import relay_wire
from meshnet.wire.status import error_from_rpc
from meshnet.wire.tls import LinkSecurity, hop_server_name

MARKER = b"PLAINTEXT-MARKER-relay-must-never-see-this"


async def _who(
    address: str, dialer: LinkSecurity | None, node_id: str, payload: bytes = b"hi", timeout_s: float = 10.0
) -> bytes:
    async with RenewingChannel(address, dialer, hop_server_name(node_id)) as channel:
        try:
            return await who(channel.channel())(payload, timeout=timeout_s)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None


async def _forwarder_closes_with_its_channel(address: str, dialer: LinkSecurity) -> None:
    channel = dial(address, dialer, ANY_WORKER_NAME, [])
    assert isinstance(channel, RelayedChannel)
    scheme, _, path = channel.forwarder.address.partition(":")
    assert scheme == "unix"
    await who(channel)(b"hi", timeout=10)
    await channel.close()
    with pytest.raises(OSError):
        await asyncio.open_unix_connection(path)


async def _closed(relay: str, security: LinkSecurity | None, timeout_s: float = 5.0) -> relay_wire.RelayLoadFigures:
    deadline = time.monotonic() + timeout_s
    while (load := await fetch_load(relay, security)).open_connections and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return load


async def test_a_relayed_call_runs_end_to_end_and_the_relay_sees_only_tls_records(tmp_path: Path) -> None:
    relay = RelayProcess.start(tmp_path, "relay-1", capture=True)
    try:
        private = PrivateServer(security_of(tmp_path, "private", "worker"))
        dialer = security_of(tmp_path, "gateway", "gateway")
        async with private.attached([relay.address]) as attachment:
            address = await attachment.address()
            assert address == f"{private.node_id}@{relay.address}"
            answer = await _who(address, dialer, private.node_id, MARKER * 100)
            assert answer == dialer.identity.node_id.encode() + b"|" + MARKER * 100
            await _forwarder_closes_with_its_channel(address, dialer)
            load = await _closed(relay.address, dialer)
        assert load.attached_nodes == 1 and load.open_connections == 0
        assert load.bytes_to_nodes > len(MARKER) * 100 and load.bytes_from_nodes > len(MARKER) * 100
    finally:
        relay.component.stop()
    assert relay.capture_dir is not None
    with pytest.raises(ValueError):  # the parser does tell plaintext from records
        tls_records(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    captures = sorted(relay.capture_dir.iterdir())
    assert {path.name.split("-", 1)[1] for path in captures} == {"to-node.bin", "from-node.bin"}
    for path in captures:
        data = path.read_bytes()
        kinds = {kind for kind, _ in tls_records(data)}
        assert 23 in kinds, f"{path.name} carried no application data"
        assert b"PRI * HTTP/2.0" not in data and MARKER not in data and b"/meshnet.test" not in data


async def test_the_relay_refuses_the_unauthenticated_the_wrong_role_and_the_revoked(tmp_path: Path) -> None:

    with Swarm(tmp_path, write_tiny_model(tmp_path)) as swarm:
        tracker = swarm.start_tracker()
        relay = RelayProcess.start(tmp_path, "relay-1", tracker=tracker)
        try:
            private = PrivateServer(security_of(tmp_path, "private", "worker"))
            dialer = security_of(tmp_path, "gateway", "gateway")
            async with private.attached([relay.address]) as attachment:
                address = await attachment.address()
                assert await _who(address, dialer, private.node_id) == dialer.identity.node_id.encode() + b"|hi"
                # A gateway may dial, never attach; a worker may not attach as another node.
                with pytest.raises(PermissionDenied, match="may not"):
                    await _attach_as(relay.address, dialer, dialer.identity.node_id)
                other = security_of(tmp_path, "other", "worker")
                with pytest.raises(PermissionDenied, match="may not attach as"):
                    await _attach_as(relay.address, other, private.node_id)
                # No client certificate, or one of another CA: no handshake, nothing reaches the node.
                calls = private.calls
                with pytest.raises(Unavailable):
                    await _dial_raw(relay.address, _presenting_nothing(dialer), private.node_id)
                with pytest.raises(Unavailable):
                    await _dial_raw(relay.address, _of_another_ca(dialer), private.node_id)
                assert private.calls == calls
                # Revoked: the relay follows the tracker's list and refuses the dial itself.
                async with TrackerClient(tracker, security=_admin(tmp_path)) as admin:
                    await admin.revoke(dialer.identity.node_id)
                await _until_refused(relay.address, dialer, private.node_id)
                assert private.calls == calls
        finally:
            relay.component.stop()


def _presenting_nothing(ours: LinkSecurity) -> LinkSecurity:
    """Trusts our CA, presents no certificate (a plain TLS client)."""
    return _NoClientCertificate(ours.node)


class _NoClientCertificate(LinkSecurity):
    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.node.ca_pem)


def _of_another_ca(ours: LinkSecurity) -> LinkSecurity:
    """Trusts our CA (public), presents a certificate of its own CA."""
    foreign = create_authority("intruder", time.time())
    node = mint_node(foreign, node_id="g-rogue", role="gateway", now_unix_s=time.time())
    return LinkSecurity(NodeCertificate(node.key_pem, node.cert_pem, ours.node.ca_pem))


def _admin(root: Path) -> LinkSecurity:
    return admin_security(root)


async def _attach_as(relay: str, security: LinkSecurity | None, node_id: str) -> None:
    async with relay_channel(relay, security) as channel:
        call = relay_wire.attach_call(channel)()
        try:
            await call.write(relay_wire.hello(node_id))
            await asyncio.wait_for(call.read(), 5)
            await call.code()
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        status = await call.code()
        if status != grpc.StatusCode.OK:
            raise error_from_rpc(call)


async def _dial_raw(
    relay: str, security: LinkSecurity | None, target: str, payload: bytes = b"", *, timeout_s: float = 5.0
) -> None:
    """A Dial straight to the relay: its header, ``payload`` as one message, then read until it ends.

    One message: a write still in flight when the relay ends the call makes grpc's aio client
    report INTERNAL ("Internal error from Core") instead of the status the relay sent."""
    async with relay_channel(relay, security) as channel:
        call = relay_wire.dial_call(channel)()
        try:
            await call.write(relay_wire.dial_header(NodeId(target)))
            if payload:
                await call.write(relay_wire.chunk(payload))
            await asyncio.wait_for(_until_ended(call), timeout_s)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None


async def _until_ended(call: grpc.aio.StreamStreamCall) -> None:
    while await call.read() is not grpc.aio.EOF:
        pass


async def _until_refused(relay: str, dialer: LinkSecurity | None, node_id: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await _dial_raw(relay, dialer, node_id, timeout_s=1.0)
        except Unauthenticated as error:
            assert "revoked" in error.message
            return
        except (TimeoutError, Unavailable):
            pass
        assert time.monotonic() < deadline, "the revocation never reached the relay"
        await asyncio.sleep(0.1)


async def test_the_relay_bounds_nodes_connections_and_message_size(tmp_path: Path) -> None:
    relay = RelayProcess.start(tmp_path, "relay-1", max_nodes=1, max_connections_per_node=1)
    # The node's port is a TCP sink here: bounds are about the relay's own accounting.
    sink = await asyncio.start_server(_discard, "127.0.0.1", 0)
    try:
        node = security_of(tmp_path, "private", "worker")
        dialer = security_of(tmp_path, "gateway", "gateway")
        second = security_of(tmp_path, "second", "worker")
        async with attached([relay.address], sink.sockets[0].getsockname()[1], node) as attachment:
            await attachment.address()
            with pytest.raises(ResourceExhausted, match="--max-nodes 1"):
                await _attach_as(relay.address, second, second.identity.node_id)
            held = asyncio.create_task(_dial_raw(relay.address, dialer, node.identity.node_id, timeout_s=30))
            await _until_open(relay.address, dialer, 1)
            with pytest.raises(ResourceExhausted, match="--max-connections-per-node 1"):
                await _dial_raw(relay.address, dialer, node.identity.node_id)
            held.cancel()
            await asyncio.gather(held, return_exceptions=True)
            await _closed(relay.address, dialer)
            # A message is at most one chunk: grpc refuses a bigger one before the relay holds it.
            with pytest.raises(ResourceExhausted, match="larger than max"):
                await _dial_raw(relay.address, dialer, node.identity.node_id, b"x" * (512 * 1024), timeout_s=10)
            load = await fetch_load(relay.address, dialer)
            assert load.refused >= 2 and load.attached_nodes == 1  # grpc refuses the oversized message itself
    finally:
        sink.close()
        relay.component.stop()


async def _discard(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while await reader.read(65536):
        pass
    writer.close()


async def _until_open(relay: str, security: LinkSecurity | None, count: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (await fetch_load(relay, security)).open_connections < count:
        assert time.monotonic() < deadline, "the dial never opened"
        await asyncio.sleep(0.05)


async def test_a_lost_relay_moves_the_node_to_the_next_and_none_left_is_a_typed_unavailable(tmp_path: Path) -> None:
    first = RelayProcess.start(tmp_path, "relay-1")
    second = RelayProcess.start(tmp_path, "relay-2")
    try:
        private = PrivateServer(security_of(tmp_path, "private", "worker"))
        dialer = security_of(tmp_path, "gateway", "gateway")
        expected = dialer.identity.node_id.encode() + b"|hi"
        async with private.attached([first.address, second.address]) as attachment:
            address = await attachment.address()
            assert address.endswith(first.address)
            assert await _who(address, dialer, private.node_id) == expected
            first.component.kill()
            killed = time.monotonic()
            moved = await attachment.address(timeout_s=5.0, other_than=address)
            assert moved == f"{private.node_id}@{second.address}" and time.monotonic() - killed < 5.0
            assert await _who(moved, dialer, private.node_id) == expected
            second.component.kill()
            started = time.monotonic()
            with pytest.raises(Unavailable):
                await _who(moved, dialer, private.node_id, timeout_s=30.0)
            assert time.monotonic() - started < 5.0
    finally:
        first.component.stop()
        second.component.stop()


async def test_a_frozen_relay_is_found_by_keepalive_and_its_dialers_fail_within_5_s(tmp_path: Path) -> None:
    """SIGSTOP: the kernel still accepts connections but nothing answers (a black-holed link)."""
    first = RelayProcess.start(tmp_path, "relay-1")
    second = RelayProcess.start(tmp_path, "relay-2")
    try:
        private = PrivateServer(security_of(tmp_path, "private", "worker"))
        dialer = security_of(tmp_path, "gateway", "gateway")
        async with private.attached([first.address, second.address]) as attachment:
            address = await attachment.address()
            first.component.kill(signal.SIGSTOP)
            frozen = time.monotonic()
            with pytest.raises(Unavailable):
                await _who(address, dialer, private.node_id, timeout_s=30.0)
            assert time.monotonic() - frozen < 5.0
            moved = await attachment.address(timeout_s=5.0, other_than=address)
            assert moved == f"{private.node_id}@{second.address}" and time.monotonic() - frozen < 5.0
            assert await _who(moved, dialer, private.node_id) == dialer.identity.node_id.encode() + b"|hi"
    finally:
        first.component.kill(signal.SIGCONT)
        first.component.stop()
        second.component.stop()


async def test_a_relay_joins_with_an_invite_of_role_relay(tmp_path: Path) -> None:

    with Swarm(tmp_path, write_tiny_model(tmp_path)) as swarm:
        tracker = swarm.start_tracker()
        join_address = (tmp_path / "swarm" / "join-address").read_text().strip()
        done = subprocess.run(
            meshnet_command(tmp_path, "swarm", "invite", "--role", "relay", "--join-address", join_address),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        elsewhere = tmp_path / "relay-machine"
        command = relay_command(
            RelayConfig(listen="127.0.0.1:0", tracker=tracker), elsewhere, SecurityOptions(join=done.stdout.strip())
        )
        component = start_component("relay", command, tmp_path / "relay.log", RelayServerLine)
        try:
            line = RelayServerLine.read(component.await_ready(time.monotonic() + 30))
            assert line.node_id is not None and line.node_id.startswith("r-")
            private = PrivateServer(security_of(tmp_path, "private", "worker"))
            dialer = security_of(tmp_path, "gateway", "gateway")
            async with private.attached([line.address]) as attachment:
                answer = await _who(await attachment.address(), dialer, private.node_id)
            assert answer == dialer.identity.node_id.encode() + b"|hi"
        finally:
            component.stop()


async def test_a_real_worker_serves_through_the_relay_under_the_dialers_own_certificate(tmp_path: Path) -> None:
    """The worker's own server (its TLS configuration, its servicers' authorization) behind a relay:
    GetMetrics admits a gateway and refuses a relay certificate, so the worker sees who dialled."""

    with Swarm(tmp_path, write_tiny_model(tmp_path)) as swarm:
        swarm.start_tracker()
        (worker,) = swarm.start_workers("0:6")
        relay = RelayProcess.start(tmp_path, "relay-1")
        name = worker.component.spec.name
        security = LinkSecurity(load_identity(swarm_dir(tmp_path) / "nodes" / name))
        port = int(worker.address.rpartition(":")[2])
        try:
            async with attached([relay.address], port, security) as attachment:
                address = await attachment.address()
                assert address == f"{worker.node_id}@{relay.address}"
                gateway = ChannelPool(MAX_FRAME_BYTES, security_of(tmp_path, "gateway", "gateway"))
                stranger = ChannelPool(MAX_FRAME_BYTES, security_of(tmp_path, "another-relay", "relay"))
                try:
                    metrics = await fetch_metrics(gateway, address)
                    assert metrics, "the worker answered no metrics"
                    with pytest.raises(PermissionDenied):
                        await fetch_metrics(stranger, address)
                finally:
                    await gateway.close()
                    await stranger.close()
        finally:
            relay.component.stop()


async def test_a_plaintext_loopback_swarm_relays_too(tmp_path: Path) -> None:
    """``--insecure`` (loopback development): no certificates, the node names itself."""

    command = relay_command(RelayConfig(listen="127.0.0.1:0"), tmp_path, INSECURE)
    component = start_component("relay", command, tmp_path / "relay.log", RelayServerLine)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "meshnet.test.Private", {"Who": grpc.unary_unary_rpc_method_handler(_echo)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    addresses: list[str | None] = []
    try:
        line = RelayServerLine.read(component.await_ready(time.monotonic() + 30))
        assert line.node_id is None
        task = asyncio.create_task(
            attach([line.address], f"127.0.0.1:{port}", None, addresses.append, node_id=NodeId("w-plain1"))
        )
        try:
            while not addresses or addresses[-1] is None:
                await asyncio.sleep(0.02)
            assert addresses[-1] == f"w-plain1@{line.address}"
            assert await _who(str(addresses[-1]), None, "w-plain1") == b"hi"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await server.stop(0)
        component.stop()


async def _echo(request: bytes, _context: grpc.aio.ServicerContext) -> bytes:
    return request
