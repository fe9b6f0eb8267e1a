"""The relay's one typed configuration; ``meshnet relay``'s flags are generated from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from meshnet.core.addresses import check_advertise_address, parse_address_list
from meshnet.core.config_flags import cli
from meshnet.core.errors import InvalidArgument
from meshnet.relay.bounds import (
    DEFAULT_BYTES_PER_S_PER_NODE,
    DEFAULT_MAX_CONNECTIONS_PER_NODE,
    DEFAULT_MAX_NODES,
    RelayBounds,
)

DEFAULT_RELAY_PORT = 7090


@dataclass(frozen=True)
class RelayConfig:
    listen: str = f"127.0.0.1:{DEFAULT_RELAY_PORT}"
    """host:port to listen on (port 0: any). Loopback by default: a relay serves nodes behind
    NAT, so give 0.0.0.0:7090 (and --advertise) deliberately on a public machine."""
    advertise: str | None = None
    """host:port that private nodes and dialers reach this relay at (default: the listen
    address, or for a wildcard the address of the interface on the default route)."""
    max_nodes: int = DEFAULT_MAX_NODES
    """Private nodes attached at once; one more is refused (RESOURCE_EXHAUSTED)."""
    max_connections_per_node: int = DEFAULT_MAX_CONNECTIONS_PER_NODE
    """Connections open at once to one attached node through this relay."""
    max_bytes_per_s: int = field(default=DEFAULT_BYTES_PER_S_PER_NODE, metadata=cli("max-bytes-per-s"))
    """Bytes a second one node's connections may carry, both ways together (bursts of a second's
    worth); over it the relay slows them down (it waits before forwarding), closing nothing."""
    tracker: str | None = None
    """The tracker (host:port, or its replicas: a:7070,b:7070) whose revocation list
    this relay enforces and which renews its certificate (secured relays; without it a revoked
    node is refused only once its certificate expires)."""
    capture_dir: Path | None = None
    """Write every spliced connection's bytes here, one file per connection and direction (for
    tests and audits: they hold only the inner TLS records)."""

    def __post_init__(self) -> None:
        host, separator, port = self.listen.rpartition(":")
        if not separator or not host or not port.isdigit() or int(port) > 65535:
            raise InvalidArgument(f"--listen {self.listen!r} must be host:port with a port from 0 to 65535")
        if self.advertise is not None:
            check_advertise_address(self.advertise)
        if self.tracker is not None:  # before --join spends a one-use invite
            parse_address_list(self.tracker)

    @property
    def bounds(self) -> RelayBounds:
        return RelayBounds(self.max_nodes, self.max_connections_per_node, self.max_bytes_per_s)
