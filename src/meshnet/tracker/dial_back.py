"""Owned addresses: before a registration is accepted, the tracker dials its declared address.

A record's address is only a claim, and "one address is one live node" (``registry.register``)
used to let a worker certificate that registered another node's address evict that node from
routes. Now a secured tracker first opens an mTLS connection to the address with the TLS name
only the registering node's certificate carries (``wire.tls.hop_server_name``) and makes one
health call over it: the handshake succeeds only if that very node answers there. A refused
registration takes nothing from anyone; an accepted one may replace the entry of a node that
was at that address before, since the new node demonstrably answers there now.

Bounded: one call with a deadline (``DIAL_BACK_TIMEOUT_S``), at most ``MAX_DIAL_BACKS`` at
once, one at a time per node id; heartbeats and routes never wait on it (it awaits the network
on the tracker's event loop). A refusal answers only once the deadline has passed and says the
same whatever failed (refused, filtered, handshake, another node), so the tracker cannot be used
to tell which ports of the worker's network are open. The host must be an IP or a DNS name: the
tracker dials nothing else (no ``unix:`` targets).

An unsecured (``--insecure``) tracker checks nothing here: without certificates nothing can be
proven about who answers, and any loopback process may register under any id anyway.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meshnet.core.addresses import check_advertise_address
from meshnet.core.errors import AddressUnproven, InvalidArgument
from meshnet.core.ids import NodeId
from meshnet.relay.dial import dial
from meshnet.wire.tls import LinkSecurity, hop_server_name

logger = logging.getLogger(__name__)

DIAL_BACK_TIMEOUT_S = 3.0
"""One TLS handshake and one small call: milliseconds on a LAN, a second on a loaded machine."""
MAX_DIAL_BACKS = 32
"""Dial-backs in flight at once: a burst of registrations (a tracker restart) waits for a slot."""
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)$")


class AddressProof:
    """Proves that a registering node answers at the address it declares, under its certificate."""

    def __init__(
        self,
        security: LinkSecurity | None,
        *,
        timeout_s: float = DIAL_BACK_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._security = security
        self._timeout_s = timeout_s
        self._clock = clock
        self._slots = asyncio.Semaphore(MAX_DIAL_BACKS)
        self._checking: set[NodeId] = set()

    async def check(self, address: str, node_id: NodeId) -> None:
        """Return once ``node_id`` answered at ``address``; ``AddressUnproven`` otherwise."""
        check_address(address)
        if self._security is None:
            return
        if node_id in self._checking:
            raise AddressUnproven(f"a registration of node {node_id} is being checked already")
        self._checking.add(node_id)
        try:
            async with self._slots:
                started = self._clock()
                if not await self._answers(address, node_id, self._security):
                    # Whatever failed, refuse at the same moment: the timing says nothing either.
                    await asyncio.sleep(max(0.0, started + self._timeout_s - self._clock()))
                    raise AddressUnproven(
                        f"node {node_id} does not answer at {address} under its own certificate (the tracker "
                        f"dialled it back within {self._timeout_s:.0f} s): register an address this node "
                        "listens on that the tracker can reach"
                    )
        finally:
            self._checking.discard(node_id)

    async def _answers(self, address: str, node_id: NodeId, security: LinkSecurity) -> bool:
        channel = dial(address, security, hop_server_name(node_id), [])
        try:
            # Any answer will do: reaching the handler needs the handshake pinned to the node.
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=self._timeout_s)
            return True
        except grpc.RpcError as error:
            logger.info("dial-back of node %s at %s failed: %s", node_id, address, error.code())
            return False
        finally:
            await channel.close()


def check_address(address: str) -> None:
    """Refuse a declared address that is not ``host:port`` with an IP or DNS-name host."""
    check_advertise_address(address, flag="the registered address")
    host = address.rpartition(":")[0]
    if not _HOST.match(host):
        raise InvalidArgument(f"the registered address {address!r} must name an IP or a DNS host")
