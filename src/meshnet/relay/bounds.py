"""What a relay admits: attached nodes, open connections per node; how fast a node's bytes go.

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
    """A token bucket of one node's bytes (both directions, all its connections together):
    ``rate`` bytes a second, bursts of up to one second's worth. Over the rate a message is
    delayed, never refused: the caller waits ``take``'s answer before forwarding, so gRPC's flow
    control pushes back on whichever sender is fast, and no connection of the node is closed for
    another's burst. The caller passes the time; nothing here reads a clock."""

    def __init__(self, rate: int, now: float) -> None:
        self._rate = rate
        self._tokens = float(rate)
        self._at = now

    def take(self, size: int, now: float) -> float:
        """Take ``size`` bytes; the seconds to wait before forwarding them (0 under the rate).

        The bucket may go into debt: each waiting message has already paid, so concurrent
        senders share the rate instead of racing for it."""
        self._tokens = min(float(self._rate), self._tokens + (now - self._at) * self._rate) - size
        self._at = now
        return 0.0 if self._tokens >= 0 else -self._tokens / self._rate
