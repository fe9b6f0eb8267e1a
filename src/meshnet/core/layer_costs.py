"""What a layer range costs a node in memory, and a worker's question "which layers should I serve?".

Shared by the tracker's placement planners, the wire conversion and the worker that measures
its model's costs from the GGUF header, so it lives below all three.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshnet.core.layers import LayerRange


@dataclass(frozen=True)
class LayerCosts:
    block_bytes: tuple[int, ...]
    """Weight bytes of each block, in model order."""
    kv_bytes_per_layer: int
    """KV one layer needs for all the sessions a node must hold."""
    head_bytes: int = 0
    """What only the first range carries."""
    tail_bytes: int = 0
    """What only the last range carries (output norm and LM head)."""
    fixed_bytes: int = 0
    """What every node carries whatever it serves (runtime, compute scratch)."""

    @property
    def n_layers(self) -> int:
        return len(self.block_bytes)

    def range_bytes(self, layers: LayerRange) -> int:
        total = self.fixed_bytes + sum(self.block_bytes[layers.start : layers.stop])
        total += self.kv_bytes_per_layer * len(layers)
        total += self.head_bytes if layers.is_head() else 0
        return total + (self.tail_bytes if layers.is_tail(self.n_layers) else 0)


@dataclass(frozen=True)
class LayerQuestion:
    """A worker about to start asks the tracker which contiguous layers the swarm needs most."""

    model: str
    """Model name or recipe fingerprint: whose served ranges count."""
    costs: LayerCosts
    """The asking worker's own costs (its sessions and context are in the KV figure)."""
    budget_bytes: int
    """Memory the asking worker may fill."""


@dataclass(frozen=True)
class LayerAdvice:
    layers: LayerRange
    reason: str
    """Why this range, in words for the worker's log (``uncovered``, ``fewest replicas``...)."""
