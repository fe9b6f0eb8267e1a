"""Values the tracker and its callers exchange: registrations, load reports, routes, work records,
and the tracker's replies.

They live in core because both sides need them and neither may import the other: the tracker
plans and stores them, workers register with them, the gateway routes and bills with them.
Every constructor validates its input and raises ``InvalidArgument``, so a value that exists is
a value that can be trusted; bounds are generous but finite, because these arrive off the wire.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from meshnet.core.errors import InvalidArgument
from meshnet.core.events import RouteHop
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.recipe import Recipe

MAX_TEXT = 256
"""Longest address, model name, quantization or id we accept."""
MAX_SESSIONS = 1_000_000
MAX_LAYERS = 100_000
MAX_TOKENS = 2**53
"""Token counts stay exact in a float64 (JSON, SQLite REAL) below this."""
MAX_ATTRIBUTION = 1024

WorkStatus = Literal["completed", "cancelled", "failed", "unverified"]
"""``unverified``: the reporter stopped mid-request (a gateway crash), so nobody can vouch for the
outcome; its counts are what was known when the request was accepted, lower bounds (DGR-013)."""
WORK_STATUSES: tuple[WorkStatus, ...] = ("completed", "cancelled", "failed", "unverified")

MAX_PEERS = 64
"""Peer latencies one heartbeat may carry."""
MAX_EXPERT_GROUP_NODES = 256
"""Nodes one expert-parallel group's front may name (a group is at most one node per expert)."""


def check_text(name: str, value: str, *, allow_empty: bool = False) -> None:
    """Raise unless ``value`` is a bounded, printable one-line string."""
    if not value and not allow_empty:
        raise InvalidArgument(f"{name} is empty")
    if len(value) > MAX_TEXT or not value.isprintable():
        raise InvalidArgument(f"{name} must be printable and at most {MAX_TEXT} characters")


def check_count(name: str, value: int, limit: int) -> None:
    if not 0 <= value <= limit:
        raise InvalidArgument(f"{name} must be in [0, {limit}], got {value}")


def check_finite(name: str, value: float, *, low: float = 0.0, high: float = math.inf) -> None:
    if not (math.isfinite(value) and low <= value <= high):
        raise InvalidArgument(f"{name} must be a finite number in [{low}, {high}], got {value}")


@dataclass(frozen=True)
class HardwareSummary:
    cpu_count: int
    memory_bytes: int

    def __post_init__(self) -> None:
        check_count("cpu_count", self.cpu_count, 1 << 16)
        check_count("memory_bytes", self.memory_bytes, 1 << 60)


@dataclass(frozen=True)
class NodeRegistration:
    """What a worker tells the tracker about itself when it joins."""

    address: str
    """host:port the shard serves on."""
    recipe: Recipe
    fingerprint: str
    """``recipe.fingerprint()``; checked on construction so a worker and tracker never disagree."""
    model: str
    quantization: str
    layers: LayerRange
    hardware: HardwareSummary
    max_sessions: int
    prefill_tokens_per_s: float
    """Measured over this node's own layer range; 0 means not measured."""
    decode_tokens_per_s: float
    """Measured over this node's own layer range, one sequence; 0 means not measured."""
    certified: bool
    """Passed the start-up whole-vs-split self-check; only certified nodes are routed to."""
    expert_group: tuple[str, ...] = ()
    """A front of an expert-parallel group: the group's node addresses in index order (they
    compute what this full-range node serves; its work records name them through this). Empty
    for a worker that computes its own layers."""

    def __post_init__(self) -> None:
        check_text("address", self.address)
        check_text("model", self.model)
        check_text("quantization", self.quantization, allow_empty=True)
        check_count("n_layers", self.recipe.n_layers, MAX_LAYERS)
        if self.fingerprint != self.recipe.fingerprint():
            raise InvalidArgument(
                f"fingerprint {self.fingerprint!r} does not match the recipe's "
                f"{self.recipe.fingerprint()!r}: the worker and tracker disagree on the recipe"
            )
        self.layers.check_within(self.recipe.n_layers)
        check_count("expert group nodes", len(self.expert_group), MAX_EXPERT_GROUP_NODES)
        for node in self.expert_group:
            check_text("expert group node", node)
        if self.expert_group and self.layers != LayerRange(0, self.recipe.n_layers):
            raise InvalidArgument(f"an expert group's front serves every layer, not {self.layers}")
        if not 1 <= self.max_sessions <= MAX_SESSIONS:
            raise InvalidArgument(f"max_sessions must be in [1, {MAX_SESSIONS}], got {self.max_sessions}")
        check_finite("prefill_tokens_per_s", self.prefill_tokens_per_s)
        check_finite("decode_tokens_per_s", self.decode_tokens_per_s)


@dataclass(frozen=True)
class NodeLoad:
    """A worker's load, reported with every heartbeat."""

    active_sessions: int = 0
    free_sessions: int = 0
    """Sessions the node can still admit: its free KV room, counted in sessions."""
    queue_depth: int = 0
    kv_used_fraction: float = 0.0
    peer_rtt_ms: tuple[tuple[str, float], ...] = ()
    """Measured round trips to candidate next hops, by address: the tracker's latency table."""
    memory_used_bytes: int = 0
    """Weights plus the KV of the sessions held now; 0: not reported."""
    memory_budget_bytes: int = 0
    """Weights plus the KV of every session the node admits; 0: not reported."""

    def __post_init__(self) -> None:
        if len(self.peer_rtt_ms) > MAX_PEERS:
            raise InvalidArgument(f"at most {MAX_PEERS} peer latencies, got {len(self.peer_rtt_ms)}")
        for address, rtt in self.peer_rtt_ms:
            check_text("peer address", address)
            check_finite("peer rtt_ms", rtt, high=600_000.0)
        check_count("active_sessions", self.active_sessions, MAX_SESSIONS)
        check_count("free_sessions", self.free_sessions, MAX_SESSIONS)
        check_count("queue_depth", self.queue_depth, MAX_SESSIONS)
        check_finite("kv_used_fraction", self.kv_used_fraction, high=1.0)
        check_count("memory_used_bytes", self.memory_used_bytes, 1 << 60)
        check_count("memory_budget_bytes", self.memory_budget_bytes, 1 << 60)


@dataclass(frozen=True)
class Route:
    """A chain of shards of one recipe whose half-open ranges meet end to start.

    A full route starts at layer 0; a failover route (``require_start_layer``) starts later.
    """

    hops: tuple[RouteHop, ...]
    epoch: int
    """Epoch the route was issued at; a changed route for a session always has a larger one."""
    model: str
    quantization: str
    fingerprint: str
    n_layers: int
    ms_per_token: float
    """The planner's estimate, for telemetry; not a promise."""

    def __post_init__(self) -> None:
        if not self.hops:
            raise InvalidArgument("a route needs at least one hop")
        for before, after in zip(self.hops, self.hops[1:], strict=False):
            if before.layers.stop != after.layers.start:
                raise InvalidArgument(
                    f"route hops {before.layers} and {after.layers} do not meet: a route must be contiguous"
                )
        self.layers.check_within(self.n_layers)
        if self.hops[-1].layers.stop != self.n_layers:
            raise InvalidArgument(f"route ends at layer {self.hops[-1].layers.stop}, not {self.n_layers}")
        if self.epoch < 0:
            raise InvalidArgument(f"route epoch must be >= 0, got {self.epoch}")

    @property
    def layers(self) -> LayerRange:
        return LayerRange(self.hops[0].layers.start, self.hops[-1].layers.stop)

    @property
    def node_ids(self) -> tuple[NodeId, ...]:
        return tuple(hop.node_id for hop in self.hops)


@dataclass(frozen=True)
class NodeWork:
    """One node's share of a request: the basis for paying contributors."""

    node_id: NodeId
    layers: LayerRange
    tokens: int

    def __post_init__(self) -> None:
        check_text("node_id", self.node_id)
        check_count("tokens", self.tokens, MAX_TOKENS)


@dataclass(frozen=True)
class WorkRecord:
    """What one request cost and who did it. ``request_id`` is the idempotency key."""

    request_id: RequestId
    model: str
    status: WorkStatus
    tokens_in: int
    tokens_out: int
    attribution: tuple[NodeWork, ...]
    billing_units: float
    started_at: float
    """Unix seconds, by the reporter's clock."""
    finished_at: float
    session_id: SessionId | None = None

    def __post_init__(self) -> None:
        check_text("request_id", self.request_id)
        check_text("model", self.model)
        if self.session_id is not None:
            check_text("session_id", self.session_id)
        if self.status not in WORK_STATUSES:
            raise InvalidArgument(f"status must be one of {WORK_STATUSES}, got {self.status!r}")
        check_count("tokens_in", self.tokens_in, MAX_TOKENS)
        check_count("tokens_out", self.tokens_out, MAX_TOKENS)
        if len(self.attribution) > MAX_ATTRIBUTION:
            raise InvalidArgument(f"at most {MAX_ATTRIBUTION} attribution entries, got {len(self.attribution)}")
        check_finite("billing_units", self.billing_units)
        check_finite("started_at", self.started_at)
        check_finite("finished_at", self.finished_at, low=self.started_at)


@dataclass(frozen=True)
class ModelSummary:
    """One recipe the swarm serves, as listed to users."""

    name: str
    fingerprint: str
    quantization: str
    n_layers: int
    nodes: int
    """Live certified nodes of this recipe."""
    routable: bool
    """Their ranges chain over every layer, so a request can be served now."""
    head_sessions: int = 0
    """Sessions the certified nodes admit at once along a route: per layer, the sessions of the
    nodes covering it, summed; the least of those is the swarm's slots (the name is the wire's)."""


@dataclass(frozen=True)
class RouteQuery:
    """What a caller asks ``ChooseRoute`` for."""

    model: str
    """Model name or recipe fingerprint."""
    session_id: SessionId | None = None
    exclude: frozenset[NodeId] = frozenset()
    start_layer: int | None = None
    """Failover of a sub-span: plan only from this layer on; the hops before it are kept."""


@dataclass(frozen=True)
class Registered:
    """The tracker's answer to a registration."""

    node_id: NodeId
    heartbeat_interval_s: float
    epoch: int


@dataclass(frozen=True)
class HeartbeatStatus:
    """The tracker's answer to a heartbeat."""

    known: bool
    """False: the tracker forgot this node (it expired or the tracker restarted); register again."""
    epoch: int
    probe: tuple[str, ...] = ()
    """Candidate next hops whose round trip this node should measure and report."""


@dataclass(frozen=True)
class WorkAck:
    """The tracker's answer to a work report."""

    request_id: RequestId
    duplicate: bool
    """True: the tracker had stored this exact record already."""


@dataclass(frozen=True)
class Deregistered:
    """The tracker's answer to a deregistration."""

    known: bool
    """False: the tracker did not know the node (already expired or never registered)."""
    epoch: int


@dataclass(frozen=True)
class QuarantineOrder:
    """A gateway's audit verdict against one node, or an operator lifting one (``clear``)."""

    node_id: NodeId
    reason: str
    """What the audit saw (positions, routes); never prompt or generated text."""
    request_id: RequestId | None = None
    """The audited request, whose work record becomes ``unverified``; None: no record to mark."""
    clear: bool = False

    def __post_init__(self) -> None:
        check_text("node_id", self.node_id)
        check_text("reason", self.reason, allow_empty=True)
        if self.request_id is not None:
            check_text("request_id", self.request_id)


@dataclass(frozen=True)
class Quarantined:
    """The tracker's answer to a quarantine order."""

    known: bool
    """Quarantining: the node was live. Clearing: it was quarantined."""
    record_marked: bool
    """The order's work record exists and is now ``unverified``."""
    epoch: int
