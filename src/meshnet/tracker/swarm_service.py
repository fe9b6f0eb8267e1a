"""The Swarm service: Join with an invite (join port), Renew and Revoke (main, mTLS port).

The tracker is the swarm's CA at run time: it signs CSRs of invited joiners, re-signs those of
nodes renewing, and keeps the revocation list every member follows (Tracker.WatchRevocations).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

import grpc

from meshnet.core.ids import NodeId, new_node_id
from meshnet.security.certificates import (
    DEFAULT_NODE_LIFETIME_S,
    SwarmAuthority,
    certificate_expiry,
    mint_node,
    sign_csr,
)
from meshnet.security.identity import PeerIdentity, Role
from meshnet.security.invites import InviteLedger, SwarmBook
from meshnet.security.policy import authorize_tracker
from meshnet.security.swarm_dir import TRACKER_IDENTITY, book_path, ensure_swarm, mint_identity, swarm_dir
from meshnet.tracker.admission import Admission
from meshnet.tracker.call_guards import admitted, counted, maps_errors
from meshnet.tracker.registry import NodeRegistry
from meshnet.tracker.revocation_feed import RevocationFeed
from meshnet.wire import services
from meshnet.wire import swarm_wire as wire
from meshnet.wire.tls import LinkSecurity, enforce

logger = logging.getLogger(__name__)

JOIN_ADDRESS_FILE = "join-address"


@dataclass(frozen=True)
class TrackerSecurity:
    """What a secured tracker serves with: its TLS identity, the CA that signs, the book."""

    link: LinkSecurity
    authority: SwarmAuthority
    book: SwarmBook
    node_lifetime_s: float = DEFAULT_NODE_LIFETIME_S

    async def keep_own_certificate_fresh(self) -> None:
        """Re-mint the tracker's own certificate at half its life (the CA is here; no renewal call)."""
        while True:
            remaining = certificate_expiry(self.link.node.cert_pem) - self.link.clock()
            await asyncio.sleep(max(remaining / 2, 1.0))
            node = mint_node(self.authority, node_id="tracker", role="tracker", now_unix_s=self.link.clock())
            self.link.replace_node(node)
            logger.info("re-minted the tracker's certificate")

    def refresh_revocations(self) -> frozenset[str]:
        revoked = self.book.revoked()
        self.link.revocations.replace(revoked)
        return revoked


def load_tracker_security(data_dir: Path, now_unix_s: float) -> TrackerSecurity:
    """The swarm of ``data_dir`` (created on first use) and a fresh tracker certificate.

    The CA lives beside the tracker, so its own short-lived certificate is re-minted at each
    start rather than renewed."""
    authority = ensure_swarm(data_dir, now_unix_s)
    node = mint_identity(
        data_dir, authority, TRACKER_IDENTITY, node_id="tracker", role="tracker", now_unix_s=now_unix_s
    )
    return TrackerSecurity(LinkSecurity(node), authority, SwarmBook(book_path(data_dir)))


def write_join_address(data_dir: Path, address: str) -> None:
    """Where `meshnet swarm invite` reads the join address from when it is not given."""
    (swarm_dir(data_dir) / JOIN_ADDRESS_FILE).write_text(address + "\n")


def read_join_address(data_dir: Path) -> str | None:
    path = swarm_dir(data_dir) / JOIN_ADDRESS_FILE
    return path.read_text().strip() if path.exists() else None


class SwarmServicer(services.SwarmServicer):
    def __init__(
        self,
        security: TrackerSecurity,
        registry: NodeRegistry,
        revocations: RevocationFeed,
        admission: Admission | None = None,
        shared_invites: InviteLedger | None = None,
    ) -> None:
        self._security = security
        self._shared_invites = shared_invites
        """Replicas' invites (their etcd store): redeemed there, not in this copy's book."""
        # Joins and renewals sign certificates (CPU): shed like registrations while behind.
        self.admission = admission or registry.admission
        self._registry = registry
        self._revocations = revocations
        self._lock = asyncio.Lock()  # one SQLite connection: its transactions must not interleave

    @maps_errors
    @admitted("registration")
    async def Join(
        self, request: services.SwarmJoinRequest, context: grpc.aio.ServicerContext
    ) -> services.SwarmCertificateReply:
        secret, csr_pem = wire.join_from_proto(request)
        now = self._security.link.clock()
        if self._shared_invites is not None:
            # Network round trips, off the loop; single use across replicas is etcd's transaction.
            role = await asyncio.to_thread(self._shared_invites.redeem, secret, now)
        else:
            async with self._lock:
                role = self._security.book.redeem(secret, now)
        node_id = new_node_id(role)
        issued = self._issue(csr_pem, node_id, role, now)
        logger.info("node %s joined the swarm as %s", node_id, role)
        return wire.issued_to_proto(issued)

    @maps_errors
    @counted
    async def Renew(
        self, request: services.SwarmRenewRequest, context: grpc.aio.ServicerContext
    ) -> services.SwarmCertificateReply:
        peer = self._admit(context, "Renew")
        self.admission.check("registration")  # after authentication: a stranger gets no retry hint
        now = self._security.link.clock()
        return wire.issued_to_proto(self._issue(wire.renew_from_proto(request), peer.node_id, peer.role, now))

    @maps_errors
    @admitted("live")
    async def Revoke(
        self, request: services.SwarmRevokeRequest, context: grpc.aio.ServicerContext
    ) -> services.SwarmRevokeReply:
        peer = self._admit(context, "Revoke")
        node_id = wire.revoke_from_proto(request)
        async with self._lock:
            newly = self._security.book.revoke(node_id, self._security.link.clock())
            self._security.refresh_revocations()
        self._revocations.changed()
        # Out of routing at once; its certificate is refused here from now and by every member
        # as soon as its revocation watch delivers the new list.
        was_routed = self._registry.deregister(NodeId(node_id))
        logger.warning("node %s revoked by %s", node_id, peer.node_id)
        return wire.revoked_to_proto(newly, was_routed)

    def _admit(self, context: grpc.aio.ServicerContext, rpc: str) -> PeerIdentity:
        peer = self._security.link.peer(context)
        enforce(authorize_tracker(peer, rpc, subject_node_id=None, revoked=self._security.link.revocations.current()))
        return peer

    def _issue(self, csr_pem: bytes, node_id: str, role: Role, now: float) -> wire.IssuedCertificate:
        security = self._security
        cert = sign_csr(
            security.authority, csr_pem, node_id=node_id, role=role, now_unix_s=now, lifetime_s=security.node_lifetime_s
        )
        security.book.record_issued(node_id, role, now)
        return wire.IssuedCertificate(node_id, role, cert, security.authority.cert_pem, certificate_expiry(cert))
