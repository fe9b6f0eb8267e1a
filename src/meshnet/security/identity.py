"""Who a peer is: the node id and role a swarm certificate carries, and the names TLS checks.

A node certificate names its holder three ways, each for one reader:
- URI SANs ``meshnet://node/<id>`` and ``meshnet://role/<role>``: what authorization reads;
- DNS SAN ``<id>.node.meshnet``: what a caller pins when it dials a hop whose node id the route
  gave it (``grpc.ssl_target_name_override``), so one node cannot answer for another;
- DNS SAN ``node.meshnet`` (workers), ``tracker.meshnet`` (the tracker) or ``relay.meshnet``
  (relays): what a caller pins when it only knows it wants *some* worker, the tracker, or the
  relay at an address (a relayed address ``NODE@RELAY_HOST:PORT`` names no relay id; the relay
  sees only the inner TLS records, which end at the node's own pinned name).
Peers dial by IP, so no certificate needs an IP SAN: the pinned names replace the host check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import check_node_id

Role = Literal["worker", "gateway", "admin", "tracker", "relay"]
ROLES: tuple[Role, ...] = get_args(Role)
INVITE_ROLES: tuple[Role, ...] = ("worker", "gateway", "admin", "relay")
"""Roles an invite may grant: the tracker's certificate is made only by ``swarm init``."""

NODE_URI_PREFIX = "meshnet://node/"
ROLE_URI_PREFIX = "meshnet://role/"
TRACKER_NAME = "tracker.meshnet"
ANY_WORKER_NAME = "node.meshnet"
RELAY_NAME = "relay.meshnet"
NODE_NAME_SUFFIX = ".node.meshnet"


@dataclass(frozen=True)
class PeerIdentity:
    """A peer whose certificate chained to the swarm CA: who it is and what it may do."""

    node_id: str
    role: Role
    serial: int
    not_after_unix_s: float


def check_role(role: str) -> Role:
    if role not in ROLES:
        raise InvalidArgument(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return role


def node_server_name(node_id: str) -> str:
    """The TLS name a caller pins to reach exactly this node."""
    return check_node_id(node_id) + NODE_NAME_SUFFIX


def dns_names(node_id: str, role: Role) -> tuple[str, ...]:
    """Every DNS SAN a certificate for ``node_id`` as ``role`` carries."""
    names = [node_server_name(node_id)]
    if role == "worker":
        names.append(ANY_WORKER_NAME)
    if role == "tracker":
        names.append(TRACKER_NAME)
    if role == "relay":
        names.append(RELAY_NAME)
    return tuple(names)
