"""gRPC credentials from a node's PEM identity, and the identity of the peer on a call.

Every meshnet server and channel takes one ``LinkSecurity`` (or ``None``: the plaintext
loopback-only development mode). Servers call ``server_credentials()`` and, per RPC,
``peer(context)``; clients call ``channel_credentials()`` with ``channel_options(name)``,
where ``name`` is the TLS name to pin: ``hop_server_name(node_id)`` for a route hop,
``security.identity.TRACKER_NAME`` for the tracker. Peers are dialled by IP, so the pinned
name, not the host, is what TLS checks; the CA is the only trust root, never the system store.
"""

from __future__ import annotations

import hashlib
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from meshnet.core.errors import InvalidArgument, PermissionDenied, Unauthenticated, Unavailable
from meshnet.security.certificates import CertificateRefused, NodeCertificate, PeerReader, read_peer
from meshnet.security.identity import ANY_WORKER_NAME, TRACKER_NAME, PeerIdentity, node_server_name
from meshnet.security.policy import Revocations, Verdict

__all__ = [
    "LinkSecurity",
    "bind",
    "channel_options",
    "enforce",
    "fetch_pinned_ca",
    "hop_server_name",
    "link_options",
    "secure_or_plain_channel",
]


KEEPALIVE_TIME_MS = 1_000
"""A link pings its peer after this long without hearing from it."""
PING_TIMEOUT_MS = 1_500
"""An unanswered ping ends the link (every stream on it UNAVAILABLE) after this long."""


def link_options(max_frame_bytes: int) -> list[tuple[str, Any]]:
    """Options of every channel and server that carries frames of up to ``max_frame_bytes``."""
    return [
        ("grpc.max_send_message_length", max_frame_bytes),
        ("grpc.max_receive_message_length", max_frame_bytes),
        # Find a silently dead peer (a link down, black-holed traffic, a frozen process whose
        # kernel still acknowledges its TCP segments) within ~2.5 s, not at the TCP timeout: a
        # failover must start well inside the 5 s a user will wait. A PING a second per
        # connection is a few bytes; the peer's gRPC threads answer it without its Python, so a
        # busy engine never misses one.
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", PING_TIMEOUT_MS),
        # grpc 1.85 ends an unanswered keepalive ping after ``ping_timeout_ms`` (60 s by default),
        # not after ``keepalive_timeout_ms``: measured with a SIGSTOPped peer under an open stream,
        # without it the stream ended 61.0 s after the freeze (a hung middle went unnoticed for 61 s
        # mid-request), with it 2.5 s after.
        ("grpc.http2.ping_timeout_ms", PING_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Worker servers take these options too: they must accept the pings above, or after ~30 s
        # without data (a long step, an idle session) they answer GOAWAY too_many_pings and kill
        # every stream on the connection.
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 1_000),
        ("grpc.http2.max_ping_strikes", 0),
    ]


def hop_server_name(node_id: str | None) -> str:
    """The TLS name that only ``node_id``'s certificate carries (any worker when unknown)."""
    return ANY_WORKER_NAME if not node_id else node_server_name(node_id)


class LinkSecurity:
    """One process's TLS identity (renewable in place) and the revocation list it enforces.

    ``store``: the folder the identity was read from; a renewed certificate is written back
    there. Servers fetch the current certificate at every handshake; channel pools and tracker
    clients watch ``generation`` and open new channels once it moves."""

    def __init__(
        self,
        node: NodeCertificate,
        revocations: Revocations | None = None,
        clock: Callable[[], float] = time.time,
        *,
        store: Path | None = None,
    ) -> None:
        self._node = node
        self.revocations = revocations or Revocations()
        self.clock = clock
        self.store = store
        self.generation = 0
        self._peers = PeerReader()
        """Callers' certificates already verified against the CA (``security.certificates``)."""

    @property
    def node(self) -> NodeCertificate:
        return self._node

    def replace_node(self, node: NodeCertificate) -> None:
        """Switch to a renewed certificate: new handshakes, both ways, use it from now on."""
        self._node = node
        self.generation += 1

    @property
    def identity(self) -> PeerIdentity:
        """This process's own node id and role, as its certificate states them."""
        return read_peer(self.node.cert_pem, self.node.ca_pem, self.clock())

    def server_credentials(self, *, require_client_cert: bool = True) -> grpc.ServerCredentials:
        served = [self.generation]

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            # Called by grpc before each handshake: None keeps the configuration it has.
            if served[0] == self.generation:
                return None
            served[0] = self.generation
            return self._certificate_configuration()

        return grpc.dynamic_ssl_server_credentials(
            self._certificate_configuration(), fetch, require_client_authentication=require_client_cert
        )

    def _certificate_configuration(self) -> grpc.ServerCertificateConfiguration:
        # The chain includes the CA, so a joiner can read the CA it pins from the handshake.
        node = self.node
        return grpc.ssl_server_certificate_configuration(
            [(node.key_pem, node.cert_pem + node.ca_pem)], root_certificates=node.ca_pem
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.node.ca_pem, self.node.key_pem, self.node.cert_pem)

    def peer(self, context: grpc.aio.ServicerContext | grpc.ServicerContext) -> PeerIdentity:
        """Who is calling, from the certificate TLS verified; ``Unauthenticated`` when nobody usable."""
        certs = context.auth_context().get("x509_pem_cert")
        if not certs:
            raise Unauthenticated("this port requires a swarm client certificate")
        try:
            identity = self._peers.read(certs[0], self.node.ca_pem, self.clock())
        except (CertificateRefused, InvalidArgument) as error:
            raise Unauthenticated(error.message) from None
        if identity.node_id in self.revocations.current():
            raise Unauthenticated(f"node {identity.node_id} is revoked")
        return identity


def channel_options(server_name: str) -> list[tuple[str, Any]]:
    """Options that pin ``server_name`` as the TLS name checked against the peer's certificate."""
    return [("grpc.ssl_target_name_override", server_name), ("grpc.default_authority", server_name)]


def secure_or_plain_channel(
    address: str, security: LinkSecurity | None, server_name: str, options: list[tuple[str, Any]]
) -> grpc.aio.Channel:
    """A channel to ``address``: mTLS pinned to ``server_name`` when secured, plaintext otherwise."""
    if security is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(
        address, security.channel_credentials(), options=[*options, *channel_options(server_name)]
    )


def bind(server: grpc.aio.Server, target: str, security: LinkSecurity | None) -> int:
    """Listen on ``target``: mTLS when secured, plaintext otherwise (callers refuse that off loopback)."""
    if security is None:
        return server.add_insecure_port(target)
    return server.add_secure_port(target, security.server_credentials())


def fetch_pinned_ca(address: str, fingerprint: str, *, timeout_s: float = 5.0) -> bytes:
    """The CA certificate (PEM) a TLS server at ``address`` presents, if its SHA-256 is ``fingerprint``.

    Read from the handshake without trusting anything yet; the pin is what makes it trusted.
    Every later call then verifies the server against this CA with full TLS checks.
    """
    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # only to read the chain; the pin below decides
    context.set_alpn_protocols(["h2"])
    try:
        with (
            socket.create_connection((host, int(port)), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=TRACKER_NAME) as tls,
        ):
            chain = _unverified_chain(tls)
    except (OSError, ValueError) as error:
        raise Unavailable(f"cannot reach the join port {address}: {error}") from None
    for der in chain:
        if hashlib.sha256(der).hexdigest() == fingerprint:
            return ssl.DER_cert_to_PEM_cert(der).encode()
    raise PermissionDenied(f"the server at {address} does not present the swarm CA {fingerprint[:16]}… of the token")


def _unverified_chain(tls: ssl.SSLSocket) -> list[bytes]:
    # Public from Python 3.13 on; the same method exists on the private object from 3.10.
    getter = getattr(tls, "get_unverified_chain", None) or tls._sslobj.get_unverified_chain  # type: ignore[attr-defined]
    certs = getter() or []
    return [cert if isinstance(cert, bytes) else cert.public_bytes(ssl._ssl.ENCODING_DER) for cert in certs]  # type: ignore[attr-defined]


def enforce(verdict: Verdict) -> None:
    """Raise the typed error a refused verdict stands for (servicers map it to its status)."""
    if verdict.allowed:
        return
    if verdict.status == "unauthenticated":
        raise Unauthenticated(verdict.reason)
    raise PermissionDenied(verdict.reason)
