"""The options of a node's swarm identity and of ``meshnet swarm``: plain values, cheap to import.

The command line builds its parser from these (``core.config_flags``) for every command, so they
live apart from the code that acts on them (``membership.join``, ``cli.commands.swarm``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from meshnet.core.addresses import parse_address_list
from meshnet.core.config_flags import cli
from meshnet.core.errors import InvalidArgument


@dataclass(frozen=True)
class SecurityOptions:
    """How a process proves who it is on the swarm's links."""

    identity: Path | None = None
    """Folder with key.pem, cert.pem and ca.pem (default: DATA_DIR/identity/ROLE, from --join)."""
    join: str | None = None
    """Join token from `meshnet swarm invite`; used when no current identity is stored."""
    insecure: bool = field(default=False)
    """Plaintext, unauthenticated gRPC: loopback development only (refused on any other bind)."""


@dataclass(frozen=True)
class SwarmArguments:
    action: Literal["init", "invite", "revoke"] = field(metadata=cli(positional=True))
    """init: create the swarm CA here; invite: print a join token; revoke: refuse a node everywhere."""
    node: str | None = field(default=None, metadata=cli(positional=True))
    """The node id to revoke (revoke only)."""
    role: Literal["worker", "gateway", "admin", "relay"] = "worker"
    """What the invite's holder may be (invite only)."""
    expires: str = "1h"
    """How long the invite is valid: a number with s, m, h or d (invite only)."""
    uses: int = 1
    """How many nodes may join with the invite (invite only)."""
    join_address: str | None = None
    """host:port of the tracker's join port for the token (default: what the tracker last announced)."""
    tracker: str = "127.0.0.1:7070"
    """The tracker to send the revocation to (revoke only; host:port, or its replicas a:7070,b:7070)."""
    store: str = ""
    """The etcd store tracker replicas share (their ``--store etcd://...``): the invite is kept
    there, so any replica redeems it (invite only; empty: this data dir's book, one tracker)."""

    def __post_init__(self) -> None:
        parse_address_list(self.tracker)
        # Accepted and ignored, it would let `swarm revoke --store ...` look as if it reached etcd.
        if self.store and self.action != "invite":
            raise InvalidArgument(f"--store names where an invite is kept: `swarm invite` only, not `{self.action}`")
