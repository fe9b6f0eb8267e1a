"""A private node's link to a relay: attach, serve announced dialers, move on when it is lost.

``attach`` runs for the node's life (cancel it to stop). It attaches to the first relay of the
list that answers, reports the address dialers reach the node at now (``NODE@RELAY_HOST:PORT``,
as the relay advertises itself) through ``on_address``, and for each dialer the relay announces
opens a Splice stream on the same channel and a TCP connection to the node's own gRPC port: the
node's server does the inner TLS handshake with the dialer, end to end. When the relay is lost
(keepalive: ~2.5 s; a killed process at once) it reports ``None`` and attaches to the next relay,
round the list; after a round where no attachment lasted it waits ``retry_s``, doubling each such
round up to ``MAX_RETRY_S``. A renewed certificate re-attaches to the same relay with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

import grpc
import grpc.aio

from meshnet.core.addresses import parse_relayed
from meshnet.core.errors import InvalidArgument, MeshnetError, Unavailable
from meshnet.core.ids import NodeId
from meshnet.relay.dial import relay_channel
from meshnet.relay.pump import splice_socket
from meshnet.wire import relay_wire
from meshnet.wire.status import error_from_rpc
from meshnet.wire.tls import LinkSecurity

logger = logging.getLogger(__name__)

ATTACH_TIMEOUT_S = 2.5
"""How long a relay may take to accept an attachment before the next one is tried."""
RETRY_S = 0.5
MAX_RETRY_S = 8.0
"""The longest wait between rounds of the relay list: the wait doubles after each round where no
attachment lasted ``STABLE_S`` (two processes with one node id would otherwise replace each other's
attachment as fast as the relay answers)."""
STABLE_S = 10.0
RENEWAL_POLL_S = 1.0
"""How often the link looks for a renewed certificate (it re-attaches over a fresh channel then:
the relay checks the certificate on every Splice, so an old one is refused once it expires)."""

AddressCallback = Callable[[str | None], None]


async def attach(
    relays: Sequence[str],
    local_address: str,
    security: LinkSecurity | None,
    on_address: AddressCallback,
    *,
    node_id: NodeId | None = None,
    retry_s: float = RETRY_S,
) -> None:
    """Keep this node attached to one of ``relays`` (in order) until cancelled.

    ``local_address``: the node's own gRPC server, ``host:port`` as this machine reaches it.
    ``node_id``: needed only without ``security`` (the certificate's id is used otherwise)."""
    if not relays:
        raise InvalidArgument("a private node needs at least one relay to attach to")
    node = NodeId(security.identity.node_id) if security is not None else node_id
    if node is None:
        raise InvalidArgument("attaching without a certificate needs the node id")
    index = 0
    failed_in_a_row = 0
    quiet_rounds = 0
    while True:
        relay = relays[index % len(relays)]
        started = time.monotonic()
        renewed = False
        try:
            renewed = await _attached(relay, node, local_address, security, on_address)
        except (MeshnetError, OSError) as error:
            logger.warning("relay %s: %s", relay, error)
        finally:
            on_address(None)
        if renewed:
            continue  # the same relay again, over a channel with the renewed certificate
        if time.monotonic() - started >= STABLE_S:
            failed_in_a_row = quiet_rounds = 0
        else:
            failed_in_a_row += 1
        index += 1
        if failed_in_a_row >= len(relays):
            failed_in_a_row = 0
            await asyncio.sleep(min(retry_s * 2**quiet_rounds, MAX_RETRY_S))
            quiet_rounds += 1


async def _attached(
    relay: str, node: NodeId, local_address: str, security: LinkSecurity | None, on_address: AddressCallback
) -> bool:
    """Serve one attachment until the relay is lost (``Unavailable`` before it had attached;
    afterwards it returns, so the next relay is tried at once) or this node's certificate is
    renewed (returns True: attach again with it)."""
    channel = relay_channel(relay, security)
    splices: set[asyncio.Task[None]] = set()
    call = relay_wire.attach_call(channel)()
    attached = False
    try:
        await call.write(relay_wire.hello(node))
        first = await asyncio.wait_for(call.read(), ATTACH_TIMEOUT_S)
        address = _announced(relay, node, relay_wire.read_event(first) if first is not grpc.aio.EOF else None)
        attached = True
        logger.info("attached to relay %s: reachable at %s", relay, address)
        on_address(address)
        serving = asyncio.create_task(_serve(call, channel, local_address, splices))
        renewal = asyncio.create_task(_until_renewed(security))
        try:
            await asyncio.wait((serving, renewal), return_when=asyncio.FIRST_COMPLETED)
        finally:
            serving.cancel()
            renewal.cancel()
        if renewal.done() and not renewal.cancelled():
            logger.info("certificate renewed: attaching to relay %s again with it", relay)
            return True
        serving.result()
        logger.warning("relay %s ended the attachment", relay)
    except TimeoutError:
        raise Unavailable(f"relay {relay} did not answer within {ATTACH_TIMEOUT_S} s") from None
    except grpc.RpcError as error:
        if not attached:
            raise error_from_rpc(error) from None
        logger.warning("lost relay %s: %s", relay, error_from_rpc(error))
    finally:
        call.cancel()
        for task in list(splices):
            task.cancel()
        await asyncio.gather(*splices, return_exceptions=True)
        await channel.close()
    return False


def _announced(relay: str, node: NodeId, event: object) -> str:
    """The address the relay announced, if it is a relayed address of this very node (a relay
    that names another would have the node register someone else's address)."""
    if not isinstance(event, str):
        raise Unavailable(f"relay {relay} did not accept the attachment")
    try:
        relayed = parse_relayed(event)
    except InvalidArgument:
        relayed = None
    if relayed is None or relayed.node_id != node:
        raise Unavailable(f"relay {relay} announced {event!r}, which is no relayed address of node {node}")
    return event


async def _serve(
    call: grpc.aio.StreamStreamCall, channel: grpc.aio.Channel, local_address: str, splices: set[asyncio.Task[None]]
) -> None:
    """Open a Splice for each dialer the relay announces, until it ends the attachment."""
    while (event := await call.read()) is not grpc.aio.EOF:
        opened = relay_wire.read_event(event)
        if isinstance(opened, relay_wire.ConnectionOpen):
            task = asyncio.create_task(_splice(channel, opened, local_address))
            splices.add(task)
            task.add_done_callback(splices.discard)


async def _until_renewed(security: LinkSecurity | None) -> None:
    """Return once ``security`` holds a renewed certificate (never without security)."""
    if security is None:
        await asyncio.Event().wait()
        return
    generation = security.generation
    while security.generation == generation:
        await asyncio.sleep(RENEWAL_POLL_S)


async def _splice(channel: grpc.aio.Channel, opened: relay_wire.ConnectionOpen, local_address: str) -> None:
    host, _, port = local_address.rpartition(":")
    call = relay_wire.splice_call(channel)()
    try:
        reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    except OSError as error:
        logger.warning("cannot reach this node's own port %s for a relayed dialer: %s", local_address, error)
        call.cancel()
        return
    with contextlib.suppress(grpc.RpcError, OSError):
        await call.write(relay_wire.splice_header(opened.connection))
        await splice_socket(reader, writer, call)
    writer.close()
