"""What a relay admits: attached nodes, open connections per node, bytes per second per node.

Pure decisions over counts and an injected clock, so they are tested without a socket. A refusal
is ``ResourceExhausted`` (RESOURCE_EXHAUSTED on the wire) with the bound's flag in its message.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshnet.core.errors import InvalidArgument, ResourceExhausted

DEFAULT_MAX_NODES = 256
DEFAULT_MAX_CONNECTIONS_PER_NODE = 64
DEFAULT_BYTES_PER_S_PER_NODE = 64 * 1024 * 1024
"""64 MiB/s each way: a hidden state of an 8B model is 16 KiB a token, so decode never nears it;
a prefill of a long prompt (megabytes) crosses in a fraction of a second."""


@dataclass(frozen=True)
class RelayBounds:
    max_nodes: int = DEFAULT_MAX_NODES
    max_connections_per_node: int = DEFAULT_MAX_CONNECTIONS_PER_NODE
    bytes_per_s_per_node: int = DEFAULT_BYTES_PER_S_PER_NODE

    def __post_init__(self) -> None:
        for name in ("max_nodes", "max_connections_per_node", "bytes_per_s_per_node"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"the relay's {name.replace('_', ' ')} must be at least 1")


def admit_attach(bounds: RelayBounds, attached: int, *, already_attached: bool) -> None:
    """A node may attach while fewer than ``max_nodes`` are; one re-attaching replaces itself."""
    if not already_attached and attached >= bounds.max_nodes:
        raise ResourceExhausted(
            f"this relay holds {attached} attached nodes, its bound (--max-nodes {bounds.max_nodes}): "
            "attach to another relay"
        )


def admit_connection(bounds: RelayBounds, node_id: str, open_for_node: int) -> None:
    """A dial to ``node_id`` may open while it has fewer than ``max_connections_per_node``."""
    if open_for_node >= bounds.max_connections_per_node:
        raise ResourceExhausted(
            f"node {node_id} has {open_for_node} connections open through this relay, its bound "
            f"(--max-connections-per-node {bounds.max_connections_per_node})"
        )


class ByteBudget:
    """A token bucket of one node's bytes (both directions together): ``rate`` bytes a second,
    bursts of up to one second's worth. The caller passes the time; nothing here reads a clock."""

    def __init__(self, rate: int, now: float) -> None:
        self._rate = rate
        self._tokens = float(rate)
        self._at = now

    def spend(self, node_id: str, size: int, now: float) -> None:
        """Take ``size`` bytes; ``ResourceExhausted`` when the node is over its rate."""
        self._tokens = min(float(self._rate), self._tokens + (now - self._at) * self._rate)
        self._at = now
        if size > self._tokens:
            raise ResourceExhausted(
                f"node {node_id} sends more than its bound through this relay "
                f"(--max-bytes-per-s {self._rate}): the connection is closed"
            )
        self._tokens -= size
