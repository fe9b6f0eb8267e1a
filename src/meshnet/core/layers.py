"""Half-open layer ranges: the unit of shard ownership."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from meshnet.core.errors import InvalidArgument


@dataclass(frozen=True, order=True)
class LayerRange:
    """Layers ``start .. stop-1`` of a model: half-open, like Python slices.

    Half-open ranges make adjacency trivial (``a.stop == b.start``) and lengths exact
    (``stop - start``), which is why routes are chains of them.
    """

    start: int
    stop: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.stop <= self.start:
            raise InvalidArgument(
                f"layer range {self.start}:{self.stop} is empty or negative; write A:B with 0 <= A < B (B is exclusive)"
            )

    @classmethod
    def parse(cls, text: str) -> LayerRange:
        """Parse ``"A:B"`` (B exclusive)."""
        parts = text.strip().split(":")
        if len(parts) != 2:
            raise InvalidArgument(f"layer range {text!r} must look like A:B (B exclusive)")
        try:
            start, stop = int(parts[0]), int(parts[1])
        except ValueError:
            raise InvalidArgument(f"layer range {text!r} must hold two integers, A:B") from None
        return cls(start, stop)

    def __len__(self) -> int:
        return self.stop - self.start

    def __str__(self) -> str:
        return f"{self.start}:{self.stop}"

    def __contains__(self, layer: object) -> bool:
        return isinstance(layer, int) and self.start <= layer < self.stop

    def check_within(self, n_layers: int) -> None:
        """Raise unless the range fits a model of ``n_layers`` layers."""
        if self.stop > n_layers:
            raise InvalidArgument(
                f"layer range {self} is out of bounds: the model has {n_layers} layers (0:{n_layers})"
            )

    def is_head(self) -> bool:
        return self.start == 0

    def is_tail(self, n_layers: int) -> bool:
        return self.stop == n_layers


def split_evenly(n_layers: int, n_shards: int) -> list[LayerRange]:
    """Cut ``[0, n_layers)`` into ``n_shards`` contiguous ranges whose sizes differ by at most one."""
    if n_shards < 1 or n_shards > n_layers:
        raise InvalidArgument(f"cannot split {n_layers} layers into {n_shards} shards")
    base, extra = divmod(n_layers, n_shards)
    ranges, start = [], 0
    for index in range(n_shards):
        stop = start + base + (1 if index < extra else 0)
        ranges.append(LayerRange(start, stop))
        start = stop
    return ranges


MAX_SHARED_CORE_SPLITS = 200_000
"""Candidate splits ``split_by_work`` tries one by one when shards share cores."""


def split_by_work(
    work: Sequence[float], n_shards: int, *, tail_work: float = 0.0, cores: Sequence[int] | None = None
) -> list[LayerRange]:
    """Cut ``[0, len(work))`` into ``n_shards`` contiguous ranges whose busiest one does the least.

    ``work[i]`` is layer i's cost per token, ``tail_work`` what only the last range adds (the LM
    head). On a pipelined route the busiest shard sets the pace of every session, so an even
    count of layers leaves the others waiting for a tail that also runs the LM head.

    ``cores``: the core each shard runs on, when several share one (more shards than cores on
    one machine): then the busiest *core* is what sets the pace, and its shards' work is summed.
    """
    n_layers = len(work)
    if n_shards < 1 or n_shards > n_layers:
        raise InvalidArgument(f"cannot split {n_layers} layers into {n_shards} shards")
    if any(w < 0 for w in work) or tail_work < 0:
        raise InvalidArgument("layer work cannot be negative")
    if cores is not None and len(cores) != n_shards:
        raise InvalidArgument(f"{len(cores)} cores given for {n_shards} shards")
    prefix = [0.0]
    for w in work:
        prefix.append(prefix[-1] + w)

    def cost(start: int, stop: int) -> float:
        return prefix[stop] - prefix[start] + (tail_work if stop == n_layers else 0.0)

    if cores is not None and len(set(cores)) < n_shards:
        stops = _split_shared_cores(cost, n_layers, list(cores))
    else:
        stops = _split_own_cores(cost, n_layers, n_shards)
    return [LayerRange(a, b) for a, b in zip((0, *stops[:-1]), stops, strict=True)]


def _split_own_cores(cost: Callable[[int, int], float], n_layers: int, n_shards: int) -> tuple[int, ...]:
    """The stops of the best split when every shard has a core of its own (dynamic programming)."""
    # best[k][s]: (busiest range, sum of squared range costs, stops) for layers s.. on the last k
    # shards. Among splits as busy, the squares prefer the evener one; ties keep the earliest
    # stop, so equal work splits as ``split_evenly`` does.
    Plan = tuple[float, float, tuple[int, ...]]
    best: dict[int, dict[int, Plan]] = {1: {}}
    for start in range(n_layers):
        best[1][start] = (cost(start, n_layers), cost(start, n_layers) ** 2, (n_layers,))
    for k in range(2, n_shards + 1):
        best[k] = {}
        for start in range(n_layers - k + 1):
            options = []
            for stop in range(start + 1, n_layers - k + 2):
                busiest, squares, stops = best[k - 1][stop]
                here = cost(start, stop)
                options.append((max(here, busiest), here**2 + squares, (stop, *stops)))
            best[k][start] = min(options)
    return best[n_shards][0][2]


def _split_shared_cores(cost: Callable[[int, int], float], n_layers: int, cores: list[int]) -> tuple[int, ...]:
    """The stops of the best split when shards share cores: every split is tried (the busiest
    core's summed work is not a sum over independent ranges, so the dynamic program above does
    not apply); bounded by ``MAX_SHARED_CORE_SPLITS``."""
    n_shards = len(cores)
    if math.comb(n_layers - 1, n_shards - 1) > MAX_SHARED_CORE_SPLITS:
        raise InvalidArgument(f"too many ways to split {n_layers} layers over {n_shards} shards sharing cores")
    best: tuple[float, float, tuple[int, ...]] | None = None
    for cuts in itertools.combinations(range(1, n_layers), n_shards - 1):
        stops = (*cuts, n_layers)
        loads: dict[int, float] = {}
        for core, start, stop in zip(cores, (0, *cuts), stops, strict=True):
            loads[core] = loads.get(core, 0.0) + cost(start, stop)
        plan = (max(loads.values()), sum(load**2 for load in loads.values()), stops)
        if best is None or plan < best:
            best = plan
    if best is None:  # unreachable: n_shards <= n_layers gives at least one split
        raise InvalidArgument(f"cannot split {n_layers} layers into {n_shards} shards")
    return best[2]
