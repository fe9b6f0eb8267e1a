"""The typed settings of an expert node and of a group's front.

Both run inside ``meshnet worker``, whose flags come from ``node.config.WorkerConfig``; the CLI
(``cli/commands/expert_node.py``) and the worker's assembly build these from it, so this package
reads only what it uses and never imports the node package (the layers contract).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import check_node_id
from meshnet.core.layers import LayerRange
from meshnet.engine.llama_config import LlamaConfig
from meshnet.moe.ownership import ExpertNumerics, ExpertOwnership


@dataclass(frozen=True)
class ExpertPeer:
    """One entry of ``--expert-peers``: where the node listens and, if known, who it is.

    With a node id, only that node's certificate may answer at the address or send that index's
    rows (one node cannot stand in for another); without one, any worker of the swarm may."""

    address: str
    node_id: str | None = None

    @classmethod
    def parse(cls, entry: str) -> ExpertPeer:
        node_id, _, address = entry.strip().rpartition("@")
        if not address or ":" not in address:
            raise InvalidArgument(f"an expert peer is HOST:PORT or NODE_ID@HOST:PORT, got {entry!r}")
        return cls(address, check_node_id(node_id) if node_id else None)

    def __str__(self) -> str:
        return f"{self.node_id}@{self.address}" if self.node_id else self.address


@dataclass(frozen=True)
class ExpertNodeConfig:
    """Node I of an N-node group (``meshnet worker --experts I/N``)."""

    ownership: ExpertOwnership
    """This node's index and the group's size: it computes the routed experts ``e mod N == I``."""
    peers: tuple[ExpertPeer, ...]
    """Every node of the group in index order, this one included (``--expert-peers``)."""
    model: Path
    """The whole model's GGUF; every node loads all of it and releases the experts it does not use."""
    data_dir: Path
    """Holds the slice cache (the model's hash, its full slice)."""
    llama: LlamaConfig
    """The engine's settings; its ``max_slots`` are the sessions the node holds."""
    host: str
    """Bind address (loopback unless told otherwise)."""
    port: int
    """Port to listen on; the peers dial the one ``peers`` lists for this index."""
    tracker: str | None
    """Where to take the revocation list and renew the certificate; None: neither."""
    exchange_timeout_s: float
    """How long one layer's exchange may wait for the peers' rows before the step fails."""
    expert_cache_bytes: int | None
    """Bound on the routed-expert bytes resident on this node (``moe/stream_cache.py``); None: no bound."""

    def __post_init__(self) -> None:
        if len(self.peers) != self.ownership.count:
            raise InvalidArgument(
                f"--expert-peers must list all {self.ownership.count} nodes' addresses in index order"
            )
        if self.exchange_timeout_s <= 0:
            raise InvalidArgument(f"--expert-timeout must be positive, got {self.exchange_timeout_s:g}")

    @property
    def numerics(self) -> ExpertNumerics:
        """The settings that fix this node's arithmetic, which its front must share (the recipe)."""
        return ExpertNumerics(self.llama.max_batch_tokens, self.llama.flash_attn, self.llama.repack)

    @property
    def certification_llama(self) -> LlamaConfig:
        """The engine settings certification runs with: the node's, for one session."""
        return replace(self.llama, max_slots=1)


@dataclass(frozen=True)
class ExpertFrontConfig:
    """A worker that serves a group as one full-range shard (``meshnet worker --expert-group``)."""

    nodes: tuple[str, ...]
    """The group's node addresses (``HOST:PORT``) in index order."""
    layers: LayerRange
    """The range the front registers: the whole model, or it refuses to start."""
    numerics: ExpertNumerics
    """The front's own recipe settings; every node must compute with the same."""
