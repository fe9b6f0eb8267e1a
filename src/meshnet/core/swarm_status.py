"""What an operator sees of the swarm: the node table, layer coverage and the health verdict.

The tracker fills ``NodeTable`` from its registry; the gateway's status page, its ``/health``
and ``meshnet status`` read it. Coverage and the verdict are pure functions over the table, so
every view agrees on what "covered" and "degraded" mean.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from meshnet.core.checks import check_finite, check_text
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeRecord
from meshnet.core.reachability import Reachability, describe, is_routable
from meshnet.core.tracking import NodeLoad

NodeHealth = Literal["healthy", "late", "lost"]
"""``late``: it missed a heartbeat but is still routed; ``lost``: it left the tracker's table."""
HealthVerdict = Literal["ok", "degraded", "no_route"]


@dataclass(frozen=True)
class NodeStatus:
    """One node as the tracker knows it now: the record it registered and its last load report
    (its figures at registration until its first heartbeat). Each node in the table passed the
    tracker's certification check to register."""

    node_id: str
    record: NodeRecord
    load: NodeLoad
    """Without peer latencies: those are the tracker's routing input, not an operator's."""
    seconds_since_heartbeat: float
    routed_decode_tokens_per_s: float = 0.0
    """The decode rate the tracker routes this node by (``tracker.claims``): measured on the
    routes through it when ``speed_measured``, else its claim as far as the tracker believes it."""
    speed_measured: bool = False
    reachability: Reachability = "public"
    """How others dial it (``core.reachability``): a ``private`` node is listed, never routed."""

    @property
    def routable(self) -> bool:
        return is_routable(self.reachability)

    @property
    def reachability_words(self) -> str:
        """``public``, ``relayed via HOST:PORT``, or ``private: behind NAT, no relay attached``."""
        return describe(self.reachability, self.record.address)

    def __post_init__(self) -> None:
        check_text("node_id", self.node_id)
        check_finite("seconds_since_heartbeat", self.seconds_since_heartbeat)
        check_finite("routed_decode_tokens_per_s", self.routed_decode_tokens_per_s)


@dataclass(frozen=True)
class NodeTable:
    nodes: tuple[NodeStatus, ...]
    epoch: int
    heartbeat_interval_s: float
    expire_after_s: float


def node_health(node: NodeStatus, heartbeat_interval_s: float) -> NodeHealth:
    """Healthy while its heartbeats arrive on time (half an interval of slack for jitter)."""
    return "healthy" if node.seconds_since_heartbeat <= 1.5 * heartbeat_interval_s else "late"


@dataclass(frozen=True)
class Coverage:
    """How many live nodes serve each layer of one model (one recipe)."""

    model: str
    fingerprint: str
    n_layers: int
    counts: tuple[int, ...]
    """``counts[i]``: nodes serving layer ``i``."""

    @property
    def gaps(self) -> tuple[LayerRange, ...]:
        """Maximal runs of layers no node serves, half-open."""
        return runs_where(self.counts, lambda count: count == 0)

    @property
    def complete(self) -> bool:
        return bool(self.counts) and min(self.counts) > 0

    def as_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "fingerprint": self.fingerprint,
            "n_layers": self.n_layers,
            "counts": list(self.counts),
            "gaps": [[gap.start, gap.stop] for gap in self.gaps],
            "complete": self.complete,
        }


def runs_where(values: Sequence[int], predicate: Callable[[int], bool]) -> tuple[LayerRange, ...]:
    """Maximal half-open runs of indices whose value satisfies ``predicate``."""
    runs: list[LayerRange] = []
    start: int | None = None
    for index, value in enumerate([*values, None]):
        inside = value is not None and predicate(value)
        if inside and start is None:
            start = index
        elif not inside and start is not None:
            runs.append(LayerRange(start, index))
            start = None
    return tuple(runs)


def coverage(nodes: Iterable[NodeStatus]) -> tuple[Coverage, ...]:
    """One coverage per recipe the nodes serve, ordered by model name: a private node (nobody
    can dial it) covers nothing."""
    by_recipe: dict[str, list[NodeRecord]] = {}
    for node in nodes:
        if not node.routable:
            continue
        by_recipe.setdefault(node.record.fingerprint, []).append(node.record)
    result = []
    for fingerprint, group in by_recipe.items():
        n_layers = group[0].n_layers
        counts = [0] * n_layers
        for record in group:
            for layer in range(record.layers.start, min(record.layers.stop, n_layers)):
                counts[layer] += 1
        result.append(Coverage(group[0].model, fingerprint, n_layers, tuple(counts)))
    return tuple(sorted(result, key=lambda c: (c.model, c.fingerprint)))


@dataclass(frozen=True)
class SwarmHealth:
    """The gateway's answer to "can a request for ``model`` be served now?"."""

    status: HealthVerdict
    reason: str
    missing_layers: tuple[LayerRange, ...] = ()

    def as_json(self) -> dict[str, object]:
        return {
            "status": self.status,
            "reason": self.reason,
            "missing_layers": [[gap.start, gap.stop] for gap in self.missing_layers],
        }


def judge_health(model: str, table: NodeTable | None, error: str = "") -> SwarmHealth:
    """``no_route`` unless some recipe of ``model`` covers every layer; ``degraded`` when it does
    but a node on it is late on heartbeats (the next request may fail over)."""
    if table is None:
        return SwarmHealth("no_route", f"the tracker cannot be asked: {error or 'unreachable'}")
    served = [c for c in coverage(table.nodes) if c.model == model]
    if not served:
        # Most often a name mismatch (--model-name): say what the swarm does serve.
        others = sorted({c.model for c in coverage(table.nodes)})
        known = f"; the tracker's nodes serve {', '.join(map(repr, others))}" if others else ""
        return SwarmHealth("no_route", f"no certified node serves {model!r}{known}")
    complete = [c for c in served if c.complete]
    if not complete:
        best = min(served, key=lambda c: sum(g.stop - g.start for g in c.gaps))
        missing = ", ".join(str(gap) for gap in best.gaps)
        return SwarmHealth("no_route", f"no node serves layers {missing} of {model!r}", best.gaps)
    fingerprints = {c.fingerprint for c in complete}
    late = [
        n.record.address
        for n in table.nodes
        if n.routable
        and n.record.fingerprint in fingerprints
        and node_health(n, table.heartbeat_interval_s) != "healthy"
    ]
    if late:
        return SwarmHealth("degraded", f"a complete route exists, but {', '.join(late)} missed heartbeats")
    return SwarmHealth("ok", f"every layer of {model!r} is served")
