"""Owned addresses: before a registration is accepted, the tracker dials its declared address.

A record's address is only a claim, and "one address is one live node" (``registry.register``)
used to let a worker certificate that registered another node's address evict that node from
routes. Now a secured tracker first opens an mTLS connection to the address with the TLS name
only the registering node's certificate carries (``wire.tls.hop_server_name``) and makes one
health call over it: the handshake succeeds only if that very node answers there. A node that
does not answer there is registered ``private`` (``core.reachability``: shown in status, never
routed, it takes nothing from anyone); one that answers may replace the entry of a node that was
at that address before, since the new node demonstrably answers there now. A relayed address
(``NODE@RELAY``, a node behind NAT) is dialled through its relay, pinned end to end to the node's
own TLS name, and is ``relayed`` when the node answers there.

Bounded: one call with a deadline (``DIAL_BACK_TIMEOUT_S``, longer through a relay), at most ``MAX_DIAL_BACKS`` at
once, one at a time per node id; heartbeats and routes never wait on it (it awaits the network
on the tracker's event loop). A node that did not answer is told so only once the deadline has
passed, whatever failed (refused, filtered, handshake, another node), so the tracker cannot be
used to tell which ports of the worker's network are open. The host must be an IP or a DNS name: the
tracker dials nothing else (no ``unix:`` targets).

An unsecured (``--insecure``) tracker checks nothing here: without certificates nothing can be
proven about who answers, and any loopback process may register under any id anyway; it takes
the node's word for its reachability.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meshnet.core.addresses import check_advertise_address, is_relayed, parse_relayed
from meshnet.core.errors import AddressUnproven, InvalidArgument
from meshnet.core.ids import NodeId
from meshnet.core.reachability import (
    DeclaredReachability,
    Reachability,
    check_relayed_owner,
    needs_dial_back,
    registered_reachability,
)
from meshnet.relay.dial import DIAL_ACCEPT_TIMEOUT_S, dial
from meshnet.wire.tls import LinkSecurity, hop_server_name

logger = logging.getLogger(__name__)

DIAL_BACK_TIMEOUT_S = 3.0
"""One TLS handshake and one small call: milliseconds on a LAN, a second on a loaded machine."""
RELAYED_DIAL_BACK_TIMEOUT_S = DIAL_ACCEPT_TIMEOUT_S + DIAL_BACK_TIMEOUT_S
"""Through a relay the node first has to take the connection: the relay waits for its Splice
(``relay.server.SPLICE_TIMEOUT_S``) and the dialer for the relay's answer (``DIAL_ACCEPT_TIMEOUT_S``,
the longer). A deadline no longer than those waits would register a slow but live relayed node
private; so the relay's whole wait comes first, then the usual handshake and call."""
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

    async def reachability(self, address: str, node_id: NodeId, declared: DeclaredReachability) -> Reachability:
        """What ``node_id`` registers as at ``address``: ``private`` unless it answered there
        (through its relay for ``NODE@RELAY``) under its own certificate, or said it is private.

        ``InvalidArgument`` for an address nobody could dial or a relayed one naming another
        node; ``AddressUnproven`` while another registration of the node is being checked."""
        check_address(address)
        check_relayed_owner(address, node_id)
        if self._security is None:
            return registered_reachability(address, declared, None)
        if not needs_dial_back(address, declared):
            return "private"
        if node_id in self._checking:
            raise AddressUnproven(f"a registration of node {node_id} is being checked already")
        self._checking.add(node_id)
        try:
            async with self._slots:
                started, timeout_s = self._clock(), self.timeout_s(address)
                answered = await self._answers(address, node_id, self._security, timeout_s)
                if not answered:
                    # Whatever failed, answer at the same moment: the timing says nothing either.
                    await asyncio.sleep(max(0.0, started + timeout_s - self._clock()))
                    logger.info(
                        "node %s does not answer at %s under its own certificate: registered private", node_id, address
                    )
                return registered_reachability(address, declared, answered)
        finally:
            self._checking.discard(node_id)

    def timeout_s(self, address: str) -> float:
        """The dial-back's deadline at ``address``: longer through a relay by the relay's own wait."""
        return self._timeout_s + (RELAYED_DIAL_BACK_TIMEOUT_S - DIAL_BACK_TIMEOUT_S if is_relayed(address) else 0.0)

    async def _answers(self, address: str, node_id: NodeId, security: LinkSecurity, timeout_s: float) -> bool:
        channel = dial(address, security, hop_server_name(node_id), [])
        try:
            # Any answer will do: reaching the handler needs the handshake pinned to the node.
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
            return True
        except grpc.RpcError as error:
            logger.info("dial-back of node %s at %s failed: %s", node_id, address, error.code())
            return False
        finally:
            await channel.close()


def check_address(address: str) -> None:
    """Refuse a declared address that is not ``host:port`` (or ``NODE@host:port``) with an IP or
    DNS-name host."""
    relayed = parse_relayed(address)
    if relayed is not None:
        address = relayed.relay
    check_advertise_address(address, flag="the registered address")
    host = address.rpartition(":")[0]
    if not _HOST.match(host):
        raise InvalidArgument(f"the registered address {address!r} must name an IP or a DNS host")
