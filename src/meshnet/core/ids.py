"""Distinct id types, so a session id is never passed where a request id belongs."""

from __future__ import annotations

import re
import secrets
from typing import NewType

from meshnet.core.errors import InvalidArgument

SessionId = NewType("SessionId", str)
RequestId = NewType("RequestId", str)
NodeId = NewType("NodeId", str)
"""A node's one id, the same in every place that names the node: the tracker registers it under
this id, routes name their hops by it, a caller pins ``<id>.node.meshnet`` in the TLS handshake
of a hop, work records attribute tokens to it, holders announce artifacts under it.

Which id: on a secured swarm, the node id its certificate carries (made by the tracker at join,
kept across renewals). That is the only id another party can check, since every handshake proves
it, so the tracker refuses a registration or heartbeat that names any other, and a hop pinned by
it cannot be answered by another node. On an ``--insecure`` loopback swarm there is no
certificate: the process makes one id at start (``new_node_id``) and uses it everywhere, and the
tracker takes it as given. The tracker never makes ids up: an id it made would be a second name
for the node, unknown to the node's own logs, ready line and pinned handshakes.

Always one DNS label (``check_node_id``), so it can be a TLS server name."""

LegIncarnation = NewType("LegIncarnation", int)
"""One opening of a session's leg on a forwarding shard (``node.ring.RingLeg``): a nonzero 64-bit
nonce drawn per opening, carried on each ring batch row the leg sends and echoed by a refusal of
that row, so the refusal reaches that leg and never one opened later under the same session id
(a failover, a retry). Not a counter: nothing has to be kept or agreed to draw it.

``UNKNOWN_INCARNATION`` (0) is what an older peer sends and echoes: it names no opening."""

UNKNOWN_INCARNATION = LegIncarnation(0)

_NODE_ID = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")


def new_session_id() -> SessionId:
    return SessionId("s-" + secrets.token_hex(8))


def new_request_id() -> RequestId:
    return RequestId("req-" + secrets.token_hex(8))


def new_leg_incarnation() -> LegIncarnation:
    return LegIncarnation(secrets.randbits(64) or 1)  # never 0: that names no opening


def new_node_id(role: str) -> NodeId:
    """A fresh node id; its first letter says the role to a reader of logs (``w-…`` a worker)."""
    return NodeId(f"{role[0]}-{secrets.token_hex(6)}")


def check_node_id(node_id: str) -> NodeId:
    """``node_id`` if it is one lowercase DNS label (a-z, 0-9, '-'), else InvalidArgument."""
    if not _NODE_ID.match(node_id):
        raise InvalidArgument(f"node id {node_id!r} is not one lowercase DNS label (a-z, 0-9, '-')")
    return NodeId(node_id)
