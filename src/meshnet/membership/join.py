"""Getting and keeping a swarm identity: join with a token, renew, pick the mode, the node id.

``resolve_security`` is what every process's command line calls once: it returns the
``LinkSecurity`` the process serves and dials with (from ``--identity``, a stored identity, or
a fresh ``--join``), or ``None`` for ``--insecure``, which it allows only on loopback.
``own_node_id`` is the one id the process goes by. Renewal runs over the process's tracker
client (``TrackerClient.renew``); joining has no certificate yet, so it dials the join port
once with the CA the token pins.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from pathlib import Path

import grpc
import grpc.aio

from meshnet.core.addresses import require_loopback
from meshnet.core.errors import FailedPrecondition, MeshnetError
from meshnet.core.ids import NodeId, new_node_id
from meshnet.core.swarm_options import SecurityOptions
from meshnet.membership.tracker_client import TrackerClient
from meshnet.security.certificates import (
    CertificateRefused,
    NodeCertificate,
    ca_fingerprint,
    certificate_expiry,
    new_key_and_csr,
    read_peer,
)
from meshnet.security.identity import TRACKER_NAME, Role
from meshnet.security.invites import JoinToken, parse_token
from meshnet.security.swarm_dir import joined_identity_dir, load_identity, save_identity
from meshnet.wire import services
from meshnet.wire import swarm_wire as wire
from meshnet.wire.status import error_from_rpc
from meshnet.wire.tls import LinkSecurity, channel_options, fetch_pinned_ca

logger = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 10.0
RENEW_RETRY_S = 60.0
RENEW_AT_FRACTION = 0.5
"""Renew once half a certificate's lifetime has passed: a tracker outage of up to half the
lifetime never lets a node's certificate lapse."""


def resolve_security(
    options: SecurityOptions, *, data_dir: Path, name: str, addresses: tuple[str, ...]
) -> LinkSecurity | None:
    """The identity this process uses; ``addresses`` are the binds/peers --insecure must keep local."""
    if options.insecure:
        require_loopback(addresses)
        return None
    folder = options.identity or joined_identity_dir(data_dir, name)
    token = parse_token(options.join) if options.join else None
    node = _current(folder, token)
    if node is None:
        if token is None:
            raise FailedPrecondition(
                f"this node has no swarm identity in {folder}: pass --join TOKEN (from `meshnet swarm invite`), "
                "or --insecure on loopback"
            )
        node = join_swarm(token, folder)
    return LinkSecurity(node, store=folder)


def _current(folder: Path, token: JoinToken | None) -> NodeCertificate | None:
    """The stored identity if it is still valid (and of the token's swarm, when a token is given)."""
    if not (folder / "cert.pem").exists():
        return None
    node = load_identity(folder)
    if token is not None and ca_fingerprint(node.ca_pem) != token.ca_fingerprint:
        return None
    try:
        read_peer(node.cert_pem, node.ca_pem, time.time())
    except CertificateRefused:
        return None
    return node


def join_swarm(token: JoinToken, folder: Path) -> NodeCertificate:
    """Pin the CA of ``token``, send a CSR with its invite, store and return the identity."""
    ca_pem = fetch_pinned_ca(token.join_address, token.ca_fingerprint, timeout_s=JOIN_TIMEOUT_S)
    key_pem, csr_pem = new_key_and_csr()
    issued = asyncio.run(_join_call(token, ca_pem, csr_pem))
    if ca_fingerprint(issued.ca_pem) != token.ca_fingerprint:
        raise FailedPrecondition("the tracker answered with a certificate of another CA than the token's")
    node = NodeCertificate(key_pem, issued.cert_pem, issued.ca_pem)
    read_peer(node.cert_pem, node.ca_pem, time.time())  # refuse to store anything unusable
    save_identity(folder, node)
    logger.info("joined the swarm as %s (%s); identity in %s", issued.node_id, issued.role, folder)
    return node


async def _join_call(token: JoinToken, ca_pem: bytes, csr_pem: bytes) -> wire.IssuedCertificate:
    credentials = grpc.ssl_channel_credentials(ca_pem)
    async with grpc.aio.secure_channel(
        token.join_address, credentials, options=channel_options(TRACKER_NAME)
    ) as channel:
        try:
            reply = await services.SwarmStub(channel).Join(
                wire.join_to_proto(token.secret, csr_pem), timeout=JOIN_TIMEOUT_S
            )
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
    return wire.issued_from_proto(reply)


def renew_due_in(node: NodeCertificate, now_unix_s: float) -> float:
    """Seconds until ``node`` should be renewed: half its remaining life (0: now)."""
    return max(certificate_expiry(node.cert_pem) - now_unix_s, 0.0) * RENEW_AT_FRACTION


def own_node_id(security: LinkSecurity | None, role: Role = "worker") -> NodeId:
    """This process's one node id (``NodeId`` says why): its certificate's when secured, else
    a fresh one, made once per process by the caller and kept for its whole life."""
    return new_node_id(role) if security is None else NodeId(security.identity.node_id)


async def renew_once(client: TrackerClient, security: LinkSecurity) -> NodeCertificate:
    """Renew now: the new certificate is in use (and stored, with its key) when this returns.

    ``client`` is a client of the tracker made with ``security``: it moves to the new
    certificate by itself (``RenewingChannel``), as does every other client of this process."""
    key_pem, csr_pem = new_key_and_csr()
    issued = await client.renew(csr_pem, timeout_s=JOIN_TIMEOUT_S)
    node = replace(security.node, key_pem=key_pem, cert_pem=issued.cert_pem)
    if security.store is not None:
        save_identity(security.store, node)
    security.replace_node(node)
    logger.info("renewed the node certificate; valid until %.0f (unix s)", certificate_expiry(node.cert_pem))
    return node


async def renew_forever(client: TrackerClient, security: LinkSecurity, stop: asyncio.Event) -> None:
    """Renew at half the remaining life until ``stop``; a failed attempt is retried sooner."""
    delay = renew_due_in(security.node, time.time())
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=max(delay, 1.0))
        if stop.is_set():
            return
        try:
            await renew_once(client, security)
            delay = renew_due_in(security.node, time.time())
        except MeshnetError as error:
            logger.warning("could not renew the node certificate at %s: %s", client.address, error.message)
            delay = min(RENEW_RETRY_S, renew_due_in(security.node, time.time()))
