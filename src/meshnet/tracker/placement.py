"""Pure layer placement: which contiguous layer range each node should serve, given its memory.

A node's cost for range A:B is the bytes its layers need (weights plus the KV of the sessions it
must hold) plus what only a head or a tail carries (the token table's touched rows, the output
norm and LM head). Ranges are chosen to minimise the fullest node's share of its budget, so a
tail holding a large LM head gets fewer layers (the way Petals balances blocks by throughput).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from meshnet.core.errors import InvalidArgument
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

    def range_bytes(self, layers: LayerRange) -> int:
        n_layers = len(self.block_bytes)
        total = self.fixed_bytes + sum(self.block_bytes[layers.start : layers.stop])
        total += self.kv_bytes_per_layer * len(layers)
        total += self.head_bytes if layers.is_head() else 0
        return total + (self.tail_bytes if layers.is_tail(n_layers) else 0)


def plan_ranges(costs: LayerCosts, budgets: Sequence[int]) -> list[LayerRange]:
    """Contiguous ranges covering every layer, node i getting the i-th, minimising the largest
    cost/budget ratio; raises if even the best split overfills some node."""
    n_layers, n_nodes = len(costs.block_bytes), len(budgets)
    if n_nodes < 1 or n_nodes > n_layers:
        raise InvalidArgument(f"cannot place {n_layers} layers on {n_nodes} nodes")
    if any(budget <= 0 for budget in budgets):
        raise InvalidArgument("every node's memory budget must be positive")

    @cache
    def best(node: int, start: int) -> tuple[float, tuple[int, ...]]:
        # Nodes node.. serve layers start..n_layers; returns (worst ratio, stops of each range).
        if node == n_nodes - 1:
            return costs.range_bytes(LayerRange(start, n_layers)) / budgets[node], (n_layers,)
        options = []
        for stop in range(start + 1, n_layers - (n_nodes - node - 1) + 1):
            here = costs.range_bytes(LayerRange(start, stop)) / budgets[node]
            rest, stops = best(node + 1, stop)
            options.append((max(here, rest), (stop, *stops)))
        return min(options)

    ratio, stops = best(0, 0)
    ranges = [LayerRange(a, b) for a, b in zip((0, *stops[:-1]), stops, strict=True)]
    if ratio > 1.0:
        worst = max(range(n_nodes), key=lambda i: costs.range_bytes(ranges[i]) / budgets[i])
        need = costs.range_bytes(ranges[worst]) / 2**20
        raise InvalidArgument(
            f"the model does not fit these {n_nodes} nodes: the best split still gives node {worst} "
            f"{need:.0f} MiB against its {budgets[worst] / 2**20:.0f} MiB; add a node or memory"
        )
    return ranges
