"""swarm.proto messages ↔ plain values, for both sides of Join, Renew and Revoke."""

from __future__ import annotations

from dataclasses import dataclass

from meshnet.core.errors import InvalidArgument
from meshnet.wire.generated import swarm_pb2 as pb

MAX_SECRET_CHARS = 128


@dataclass(frozen=True)
class IssuedCertificate:
    node_id: str
    role: str
    cert_pem: bytes
    ca_pem: bytes
    not_after_unix_s: float


def join_to_proto(secret: str, csr_pem: bytes) -> pb.SwarmJoinRequest:
    return pb.SwarmJoinRequest(invite_secret=secret, csr_pem=csr_pem)


def join_from_proto(message: pb.SwarmJoinRequest) -> tuple[str, bytes]:
    if not message.invite_secret or len(message.invite_secret) > MAX_SECRET_CHARS:
        raise InvalidArgument(f"the invite secret must be 1 to {MAX_SECRET_CHARS} characters")
    return message.invite_secret, message.csr_pem


def renew_to_proto(csr_pem: bytes) -> pb.SwarmRenewRequest:
    return pb.SwarmRenewRequest(csr_pem=csr_pem)


def renew_from_proto(message: pb.SwarmRenewRequest) -> bytes:
    return message.csr_pem


def issued_to_proto(issued: IssuedCertificate) -> pb.SwarmCertificateReply:
    return pb.SwarmCertificateReply(
        node_id=issued.node_id,
        role=issued.role,
        cert_pem=issued.cert_pem,
        ca_pem=issued.ca_pem,
        not_after_unix_s=issued.not_after_unix_s,
    )


def issued_from_proto(message: pb.SwarmCertificateReply) -> IssuedCertificate:
    return IssuedCertificate(message.node_id, message.role, message.cert_pem, message.ca_pem, message.not_after_unix_s)


def revoke_to_proto(node_id: str) -> pb.SwarmRevokeRequest:
    return pb.SwarmRevokeRequest(node_id=node_id)


def revoke_from_proto(message: pb.SwarmRevokeRequest) -> str:
    if not message.node_id or len(message.node_id) > 128:
        raise InvalidArgument("name the node to revoke (1 to 128 characters)")
    return message.node_id


def revoked_to_proto(newly_revoked: bool, was_routed: bool) -> pb.SwarmRevokeReply:
    return pb.SwarmRevokeReply(newly_revoked=newly_revoked, was_routed=was_routed)


def revoked_from_proto(message: pb.SwarmRevokeReply) -> tuple[bool, bool]:
    return message.newly_revoked, message.was_routed
