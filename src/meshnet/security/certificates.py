"""The swarm CA and the certificates it signs: creation, CSRs, signing, and reading a peer's.

Keys are ECDSA P-256: BoringSSL (inside grpc) accepts them for TLS 1.3 on every platform grpc
ships, and they are small and quick to sign. Everything crosses this module's boundary as PEM
bytes; callers outside ``meshnet.security`` never see a ``cryptography`` object.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from collections import OrderedDict
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import check_node_id
from meshnet.security.identity import NODE_URI_PREFIX, ROLE_URI_PREFIX, PeerIdentity, Role, check_role, dns_names

CA_LIFETIME_S = 10 * 365 * 86400.0
DEFAULT_NODE_LIFETIME_S = 24 * 3600.0
"""Node certificates are short-lived: a revoked or stolen one is useless within a day anyway."""
MAX_CSR_BYTES = 8192
_CLOCK_SKEW_S = 300.0
"""Certificates start a little in the past, so a peer whose clock lags still accepts them."""


class CertificateRefused(InvalidArgument):
    """A certificate or CSR that is malformed, from another CA, expired, or names nobody."""

    code = "certificate_refused"


@dataclass(frozen=True)
class SwarmAuthority:
    """The swarm CA: its certificate, its private key (never leaves the data dir) and fingerprint."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def fingerprint(self) -> str:
        return ca_fingerprint(self.cert_pem)


@dataclass(frozen=True)
class NodeCertificate:
    """A node's key and the certificate the CA signed for it, with the CA certificate to trust."""

    key_pem: bytes
    cert_pem: bytes
    ca_pem: bytes


def ca_fingerprint(cert_pem: bytes) -> str:
    """SHA-256 of the certificate's DER, lowercase hex: what a join token pins."""
    return hashlib.sha256(_load_cert(cert_pem).public_bytes(serialization.Encoding.DER)).hexdigest()


def create_authority(swarm_name: str, now_unix_s: float) -> SwarmAuthority:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"meshnet swarm CA {swarm_name}")])
    start = _time(now_unix_s - _CLOCK_SKEW_S)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(_time(now_unix_s + CA_LIFETIME_S))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return SwarmAuthority(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def new_key_and_csr() -> tuple[bytes, bytes]:
    """A fresh private key and a CSR for it; the CA decides the names, so the CSR names none."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "meshnet node")]))
        .sign(key, hashes.SHA256())
    )
    return _key_pem(key), csr.public_bytes(serialization.Encoding.PEM)


def sign_csr(
    authority: SwarmAuthority,
    csr_pem: bytes,
    *,
    node_id: str,
    role: Role,
    now_unix_s: float,
    lifetime_s: float = DEFAULT_NODE_LIFETIME_S,
) -> bytes:
    """The certificate for ``csr_pem``'s key as ``node_id``/``role``; refuses a malformed CSR."""
    if len(csr_pem) > MAX_CSR_BYTES:
        raise CertificateRefused(f"a CSR is at most {MAX_CSR_BYTES} bytes, got {len(csr_pem)}")
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
        valid = csr.is_signature_valid
        public_key = csr.public_key()
    except (ValueError, TypeError, x509.UnsupportedGeneralNameType) as error:
        raise CertificateRefused(f"the CSR is not a valid PEM certificate request: {error}") from None
    if not valid:
        raise CertificateRefused("the CSR's signature does not match its key (no proof of possession)")
    if not isinstance(public_key, ec.EllipticCurvePublicKey) or public_key.curve.name != "secp256r1":
        raise CertificateRefused("the CSR's key must be ECDSA P-256")
    return issue(authority, public_key, node_id=node_id, role=role, now_unix_s=now_unix_s, lifetime_s=lifetime_s)


def issue(
    authority: SwarmAuthority,
    public_key: ec.EllipticCurvePublicKey,
    *,
    node_id: str,
    role: Role,
    now_unix_s: float,
    lifetime_s: float,
) -> bytes:
    check_node_id(node_id)
    check_role(role)
    ca_cert = _load_cert(authority.cert_pem)
    ca_key = serialization.load_pem_private_key(authority.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise CertificateRefused("the swarm CA key is not an ECDSA key")
    names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names(node_id, role)]
    names += [x509.UniformResourceIdentifier(NODE_URI_PREFIX + node_id)]
    names += [x509.UniformResourceIdentifier(ROLE_URI_PREFIX + role)]
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.COMMON_NAME, node_id),
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(_time(now_unix_s - _CLOCK_SKEW_S))
        .not_valid_after(_time(now_unix_s + lifetime_s))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def mint_node(
    authority: SwarmAuthority,
    *,
    node_id: str,
    role: Role,
    now_unix_s: float,
    lifetime_s: float = DEFAULT_NODE_LIFETIME_S,
) -> NodeCertificate:
    """Key and certificate made side by side, for nodes on the CA's own machine (``meshnet up``)."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = issue(authority, key.public_key(), node_id=node_id, role=role, now_unix_s=now_unix_s, lifetime_s=lifetime_s)
    return NodeCertificate(_key_pem(key), cert, authority.cert_pem)


def read_peer(cert_pem: bytes, ca_pem: bytes, now_unix_s: float) -> PeerIdentity:
    """The identity in a peer's certificate, after checking it is the CA's, current and named.

    TLS has already verified the chain; this re-checks it in Python so a mistake in how a
    server was configured (another CA loaded, verification off) cannot slip an identity through.
    """
    return _current(_verified_peer(cert_pem, ca_pem), now_unix_s)


class PeerReader:
    """``read_peer`` that remembers, per certificate and CA, what does not change with time: that
    the CA signed it and the identity it names. Parsing and verifying a certificate on every call
    was ~5% of a busy tracker's core; validity in time is still checked on every call. Failures
    are never remembered (TLS refuses such certificates before a call gets here anyway). Least
    recently used entries go first beyond ``max_entries`` (a swarm's nodes and gateways)."""

    def __init__(self, max_entries: int = 8192) -> None:
        self._max_entries = max_entries
        self._known: OrderedDict[tuple[bytes, bytes], _VerifiedPeer] = OrderedDict()

    def read(self, cert_pem: bytes, ca_pem: bytes, now_unix_s: float) -> PeerIdentity:
        key = (cert_pem, ca_pem)
        verified = self._known.get(key)
        if verified is None:
            verified = self._known[key] = _verified_peer(cert_pem, ca_pem)
            if len(self._known) > self._max_entries:
                self._known.popitem(last=False)
        else:
            self._known.move_to_end(key)
        return _current(verified, now_unix_s)


@dataclass(frozen=True)
class _VerifiedPeer:
    identity: PeerIdentity
    not_before_s: float
    not_after_s: float


def _verified_peer(cert_pem: bytes, ca_pem: bytes) -> _VerifiedPeer:
    """The certificate's identity and validity window, once the CA's signature on it is checked."""
    cert = _load_cert(cert_pem)
    ca = _load_cert(ca_pem)
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise CertificateRefused("the certificate was not issued by this swarm's CA") from None
    node_id, role = _names(cert)
    not_after = cert.not_valid_after_utc.timestamp()
    identity = PeerIdentity(node_id, role, cert.serial_number, not_after)
    return _VerifiedPeer(identity, cert.not_valid_before_utc.timestamp(), not_after)


def _current(verified: _VerifiedPeer, now_unix_s: float) -> PeerIdentity:
    if not verified.not_before_s <= now_unix_s < verified.not_after_s:
        serial = verified.identity.serial
        raise CertificateRefused(f"the certificate of serial {serial:x} is expired or not yet valid")
    return verified.identity


def certificate_expiry(cert_pem: bytes) -> float:
    return _load_cert(cert_pem).not_valid_after_utc.timestamp()


def new_secret() -> str:
    return secrets.token_urlsafe(24)


def _names(cert: x509.Certificate) -> tuple[str, Role]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise CertificateRefused("the certificate names no meshnet node") from None
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    nodes = [uri.removeprefix(NODE_URI_PREFIX) for uri in uris if uri.startswith(NODE_URI_PREFIX)]
    roles = [uri.removeprefix(ROLE_URI_PREFIX) for uri in uris if uri.startswith(ROLE_URI_PREFIX)]
    if len(nodes) != 1 or len(roles) != 1:
        raise CertificateRefused("a node certificate carries exactly one node id and one role")
    return check_node_id(nodes[0]), check_role(roles[0])


def _load_cert(cert_pem: bytes) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(cert_pem)
    except (ValueError, TypeError) as error:
        raise CertificateRefused(f"not a PEM certificate: {error}") from None


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _time(unix_s: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(unix_s, tz=dt.UTC)
