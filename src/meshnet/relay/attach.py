"""A private node's link to a relay: attach, serve announced dialers, move on when it is lost.

``attach`` runs for the node's life (cancel it to stop). It attaches to the first relay of the
list that answers, reports the address dialers reach the node at now (``NODE@RELAY_HOST:PORT``,
as the relay advertises itself) through ``on_address``, and for each dialer the relay announces
opens a Splice stream on the same channel and a TCP connection to the node's own gRPC port: the
node's server does the inner TLS handshake with the dialer, end to end. When the relay is lost
(keepalive: ~2.5 s; a killed process at once) it reports ``None`` and attaches to the next relay,
round the list; after a round where none answered it waits ``retry_s`` before the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

import grpc
import grpc.aio

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
    while True:
        relay = relays[index % len(relays)]
        try:
            await _attached(relay, node, local_address, security, on_address)
            failed_in_a_row = 0
        except (MeshnetError, OSError) as error:
            logger.warning("relay %s: %s", relay, error)
            failed_in_a_row += 1
        finally:
            on_address(None)
        index += 1
        if failed_in_a_row >= len(relays):
            failed_in_a_row = 0
            await asyncio.sleep(retry_s)


async def _attached(
    relay: str, node: NodeId, local_address: str, security: LinkSecurity | None, on_address: AddressCallback
) -> None:
    """Serve one attachment until the relay is lost (``Unavailable``, after it had attached:
    returns normally then, so the next relay is tried at once)."""
    channel = relay_channel(relay, security)
    splices: set[asyncio.Task[None]] = set()
    call = relay_wire.attach_call(channel)()
    attached = False
    try:
        await call.write(relay_wire.hello(node))
        first = await asyncio.wait_for(call.read(), ATTACH_TIMEOUT_S)
        address = relay_wire.read_event(first) if first is not grpc.aio.EOF else None
        if not isinstance(address, str):
            raise Unavailable(f"relay {relay} did not accept the attachment")
        attached = True
        logger.info("attached to relay %s: reachable at %s", relay, address)
        on_address(address)
        while (event := await call.read()) is not grpc.aio.EOF:
            opened = relay_wire.read_event(event)
            if isinstance(opened, relay_wire.ConnectionOpen):
                task = asyncio.create_task(_splice(channel, opened, local_address))
                splices.add(task)
                task.add_done_callback(splices.discard)
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
