"""``meshnet plan``: which layers each machine takes, what each holds, and the largest context and
the most sessions that fit, from a model's footprint and the machines' memory, before anything
starts.

It counts with the one memory cost model (``core.layer_costs``) that the workers' capacity plan,
``--layers auto`` and the tracker's placement use, and splits the layers the way the lab and the
tracker do (``best_ranges``: contiguous ranges minimising the fullest node's share of its
budget), so what it predicts is what the workers it proposes then hold.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache

from meshnet.core.errors import InvalidArgument
from meshnet.core.kv_type import KvType
from meshnet.core.layer_costs import (
    LayerCosts,
    ModelFootprint,
    WorkerLoad,
    layer_costs,
    scratch_bytes,
)
from meshnet.core.layers import LayerRange
from meshnet.core.limits import MAX_CONTEXT

SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
"""Binary units, as ``free -h`` and llama.cpp print them: ``24G`` is 24 GiB."""
SESSIONS_LIMIT = 4096
"""The most sessions the planner searches (a bound for the search, not a limit of workers)."""


def parse_size(text: str) -> int:
    """``24G``, ``512M``, ``1.5G`` or a byte count (``K``/``M``/``G``/``T`` are powers of 1024;
    a trailing ``B`` or ``iB`` is allowed)."""
    cleaned = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = cleaned[-1:] if cleaned[-1:] in SIZE_UNITS else ""
    try:
        value = float(cleaned[: len(cleaned) - len(unit)])
    except ValueError:
        raise InvalidArgument(f"{text!r} is not a memory size (e.g. 24G, 512M)") from None
    if not 0 < value < math.inf:  # nan and inf parse as floats too
        raise InvalidArgument(f"a memory size must be positive and finite, got {text!r}")
    return int(value * SIZE_UNITS[unit])


def best_ranges(costs: LayerCosts, budgets: Sequence[int]) -> tuple[list[LayerRange], float]:
    """Contiguous ranges covering every layer, node i getting the i-th, minimising the largest
    cost/budget ratio, and that ratio (above 1: even the best split overfills some node)."""
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
    return [LayerRange(a, b) for a, b in zip((0, *stops[:-1]), stops, strict=True)], ratio


@dataclass(frozen=True)
class NodeShare:
    """One machine's part of a plan and what it holds resident (bytes), by the cost model."""

    budget_bytes: int
    layers: LayerRange
    weights: int
    kv: int
    scratch: int
    runtime: int
    """Runtime, certification heap, the parsed header and the sessions' streams."""
    head_table: int
    """A head's resident share of its token table (0 for a node that is not the head)."""
    tail: int
    """A tail's output norm and LM head, vocabulary and logits (0 for a node that is not the tail)."""
    total: int

    @property
    def fits(self) -> bool:
        return self.total <= self.budget_bytes

    def reuse_store(self, prefix_cache_bytes: int) -> int:
        """What the worker's prompt-reuse store may fill: the budget the plan leaves, up to its
        size (``assembly.plan_worker_capacity`` gives it exactly this)."""
        return max(0, min(prefix_cache_bytes, self.budget_bytes - self.total))


@dataclass(frozen=True)
class SwarmPlan:
    load: WorkerLoad
    nodes: tuple[NodeShare, ...]
    """The best split for ``load`` (some node over its budget when the model does not fit)."""
    largest_context: int
    """The most positions per session that fit with ``load.sessions`` sessions (0: none)."""
    most_sessions: int
    """The most sessions of ``load.context`` positions that fit (0: none)."""
    max_context: int
    """The model's trained context (the planner searches no further)."""

    @property
    def fits(self) -> bool:
        return all(node.fits for node in self.nodes)

    def shortfalls(self) -> tuple[tuple[int, int], ...]:
        """(node index, bytes more it needs) of every overfilled node in the best split."""
        return tuple((i, node.total - node.budget_bytes) for i, node in enumerate(self.nodes) if not node.fits)


@dataclass(frozen=True)
class Remedies:
    """What would make a plan that does not fit fit, each on its own (0 or None: that does not)."""

    more_memory: tuple[tuple[int, int], ...]
    """(node index, bytes) to add to each overfilled node, the split kept."""
    context: int
    """The largest context that fits the sessions asked for (0: not even one position)."""
    sessions: int
    """The most sessions of the context asked for that fit (0: not even one)."""
    single_session_context: int
    """The largest context one session may have (0: not even one position)."""
    kv_type: KvType | None
    """The largest KV type smaller than the one asked for that fits; None: none does."""
    extra_node: int | None
    """One more node of this many bytes (the largest given) makes it fit; None: not even that."""


def node_share(footprint: ModelFootprint, load: WorkerLoad, layers: LayerRange, budget: int) -> NodeShare:
    """What a worker serving ``layers`` with ``load`` holds, part by part (sums to ``range_bytes``)."""
    costs = layer_costs(footprint, load)
    head, tail = layers.is_head(), layers.is_tail(footprint.n_layers)
    scratch = scratch_bytes(footprint, load)
    tied = costs.tied_bytes if head and tail else 0
    return NodeShare(
        budget_bytes=budget,
        layers=layers,
        weights=sum(footprint.block_bytes[layers.start : layers.stop]),
        kv=costs.kv_bytes_per_layer * len(layers),
        scratch=scratch,
        runtime=costs.fixed_bytes - scratch,
        head_table=costs.head_bytes - tied if head else 0,
        tail=costs.tail_bytes if tail else 0,
        total=costs.range_bytes(layers),
    )


def plan_swarm(footprint: ModelFootprint, budgets: Sequence[int], load: WorkerLoad, max_context: int) -> SwarmPlan:
    """The plan for ``budgets`` (bytes each node may hold, in route order) holding ``load``."""
    if load.sessions < 1 or load.context < 1 or load.prefill_chunk < 1:
        raise InvalidArgument("sessions, context and prefill chunk must each be at least 1")
    max_context = min(max_context, MAX_CONTEXT)  # a worker serves no session past 128K
    ranges, _ = best_ranges(layer_costs(footprint, load), budgets)
    nodes = tuple(node_share(footprint, load, r, b) for r, b in zip(ranges, budgets, strict=True))

    largest = _largest(lambda n: _fits(footprint, budgets, replace(load, context=n)), 1, max(max_context, 1))
    most = _largest(lambda n: _fits(footprint, budgets, replace(load, sessions=n)), 1, SESSIONS_LIMIT)
    return SwarmPlan(load, nodes, largest, most, max_context)


def remedies(footprint: ModelFootprint, budgets: Sequence[int], plan: SwarmPlan) -> Remedies:
    """What would make ``plan`` (for ``budgets``) fit: more memory where, a smaller context,
    fewer sessions, a smaller KV type, or one more node like the largest."""
    extra = max(budgets)
    more = (*budgets, extra)
    with_one_more = len(more) <= footprint.n_layers and _fits(footprint, more, plan.load)
    one = replace(plan.load, sessions=1)
    single = _largest(lambda n: _fits(footprint, budgets, replace(one, context=n)), 1, plan.max_context)
    smaller = sorted(
        (kind for kind in KvType if _kv_bytes(kind) < _kv_bytes(plan.load.kv_type)), key=_kv_bytes, reverse=True
    )
    kv_type = next((kind for kind in smaller if _fits(footprint, budgets, replace(plan.load, kv_type=kind))), None)
    return Remedies(
        plan.shortfalls(), plan.largest_context, plan.most_sessions, single, kv_type, extra if with_one_more else None
    )


def _kv_bytes(kind: KvType) -> float:
    return kind.block_bytes / kind.block_elements


def _fits(footprint: ModelFootprint, budgets: Sequence[int], load: WorkerLoad) -> bool:
    return best_ranges(layer_costs(footprint, load), budgets)[1] <= 1.0


def _largest(fits: Callable[[int], bool], low: int, high: int) -> int:
    """The largest n in [low, high] with ``fits(n)`` (cost grows with n), or 0 when none fits."""
    if not fits(low):
        return 0
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low
