"""Signing and verifying route tickets: the tracker signs with its own certificate's key, and a
shard accepts a signature only from a tracker certificate its swarm CA issued.

What is signed is bytes (``SealedTicket.body``, encoded once by ``wire.ticket_wire``), so this
module knows nothing of a ticket's content. ECDSA P-256 with SHA-256, the keys every swarm
certificate already has: no second key to distribute, and a re-minted tracker certificate (at
each start and at half life) signs from then on, while tickets signed before stay good as long
as the certificate that signed them is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from meshnet.core.errors import InvalidArgument, TicketRefused
from meshnet.core.tickets import SealedTicket
from meshnet.security.certificates import CertificateRefused, NodeCertificate, read_peer

_SIGNATURE = ec.ECDSA(hashes.SHA256())
MAX_KNOWN_SIGNERS = 16
"""Verified signer certificates kept (a tracker makes a new one at each start and half life)."""


class TicketSigner:
    """Signs ticket bodies with the key of ``node()``, the tracker's current certificate."""

    def __init__(self, node: Callable[[], NodeCertificate]) -> None:
        self._node = node
        self._key: tuple[bytes, ec.EllipticCurvePrivateKey] | None = None
        """The last key read, by its PEM: parsed again only after a renewal."""

    def seal(self, body: bytes) -> SealedTicket:
        node = self._node()
        if self._key is None or self._key[0] != node.key_pem:
            key = serialization.load_pem_private_key(node.key_pem, password=None)
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                raise CertificateRefused("the tracker's key is not an ECDSA key: it cannot sign route tickets")
            self._key = (node.key_pem, key)
        return SealedTicket(body, self._key[1].sign(body, _SIGNATURE), node.cert_pem)


@dataclass(frozen=True)
class _Signer:
    public_key: ec.EllipticCurvePublicKey
    not_before_unix_s: float
    not_after_unix_s: float


class TicketVerifier:
    """Accepts a ticket signed by a tracker certificate of the CA ``ca_pem``, current at ``clock()``."""

    def __init__(self, ca_pem: bytes, clock: Callable[[], float]) -> None:
        self._ca_pem = ca_pem
        self._clock = clock
        self._signers: dict[bytes, _Signer] = {}

    def verify(self, ticket: SealedTicket) -> None:
        """Raise ``TicketRefused`` unless ``ticket`` is signed by a current tracker certificate."""
        if not ticket.signed:
            raise TicketRefused("the route ticket is unsigned; this swarm accepts only tickets its tracker signed")
        signer = self._signer(ticket.signer)
        now = self._clock()
        if not signer.not_before_unix_s <= now < signer.not_after_unix_s:
            raise TicketRefused("the certificate that signed the route ticket is expired")
        try:
            signer.public_key.verify(ticket.signature, ticket.body, _SIGNATURE)
        except InvalidSignature:
            raise TicketRefused("the route ticket's signature does not verify: it was altered or forged") from None

    def _signer(self, cert_pem: bytes) -> _Signer:
        key = hashlib.sha256(cert_pem).digest()
        known = self._signers.get(key)
        if known is not None:
            return known
        try:
            peer = read_peer(cert_pem, self._ca_pem, self._clock())
            cert = x509.load_pem_x509_certificate(cert_pem)
        except (InvalidArgument, ValueError) as error:
            raise TicketRefused(f"the route ticket's signer is not of this swarm: {error}") from None
        if peer.role != "tracker":
            raise TicketRefused(f"the route ticket was signed by a {peer.role} certificate, not the tracker's")
        public_key = cert.public_key()
        if not isinstance(public_key, ec.EllipticCurvePublicKey):
            raise TicketRefused("the route ticket's signer has no ECDSA key")
        signer = _Signer(public_key, cert.not_valid_before_utc.timestamp(), peer.not_after_unix_s)
        if len(self._signers) >= MAX_KNOWN_SIGNERS:
            self._signers.clear()  # a handful of tracker certificates a day: forgetting all is cheap
        self._signers[key] = signer
        return signer
