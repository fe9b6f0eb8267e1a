"""Values the tracker and its callers exchange: load reports, routes, work records, and the
tracker's replies (a node's registration is its ``core.node_record.NodeRecord``).

They live in core because both sides need them and neither may import the other: the tracker
plans and stores them, workers register with them, the gateway routes and bills with them.
Every constructor validates its input and raises ``InvalidArgument``, so a value that exists is
a value that can be trusted; bounds are generous but finite, because these arrive off the wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from meshnet.core.audit_evidence import QuarantineEvidence
from meshnet.core.checks import MAX_SESSIONS, check_count, check_finite, check_text
from meshnet.core.errors import InvalidArgument
from meshnet.core.events import RouteHop
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.prefix import MAX_CHAIN_BLOCKS, check_chain
from meshnet.core.reachability import Reachability
from meshnet.core.tickets import SealedTicket

MAX_TOKENS = 2**53
"""Token counts stay exact in a float64 (JSON, SQLite REAL) below this."""
MAX_ATTRIBUTION = 1024
MAX_SESSIONS_PER_REPORT = 4096
"""Sessions one ``ReportSessionTokens`` call may count."""

WorkStatus = Literal["completed", "cancelled", "failed", "unverified", "disputed", "completed_by_shards"]
"""``unverified``: the reporter stopped mid-request (a gateway crash), so nobody can vouch for the
outcome; its counts are what was known when the request was accepted, lower bounds (DGR-013).
The last two only the tracker sets (``tracker.work_checks``): ``disputed``, a gateway's record
that does not hold up (its reason stored beside it); ``completed_by_shards``, a request whose
gateway never filed a record, counted from what its route's shards reported."""
WORK_STATUSES: tuple[WorkStatus, ...] = (
    "completed",
    "cancelled",
    "failed",
    "unverified",
    "disputed",
    "completed_by_shards",
)
REPORTED_STATUSES: tuple[WorkStatus, ...] = ("completed", "cancelled", "failed", "unverified")
"""The statuses a gateway may file; the others are the tracker's verdicts."""

MAX_PEERS = 64
"""Peer latencies one heartbeat may carry."""
MAX_PREFIX_TIPS = 64
"""Prefix tips one heartbeat may carry: a head's most recently used stored prompt prefixes."""
MAX_ROUTE_CHAIN = 256
"""Prefix chain links one route request may carry (a prompt's first 256 chunks)."""


@dataclass(frozen=True)
class PrefixFigures:
    """A node's store of reusable prompt KV (``session.kv_store``) as its heartbeat reports it."""

    bytes_held: int = 0
    budget_bytes: int = 0
    hits: int = 0
    misses: int = 0

    def __post_init__(self) -> None:
        check_count("prefix bytes", self.bytes_held, 1 << 60)
        check_count("prefix budget bytes", self.budget_bytes, 1 << 60)
        check_count("prefix hits", self.hits, MAX_TOKENS)
        check_count("prefix misses", self.misses, MAX_TOKENS)


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
    prefix_tips: tuple[tuple[bytes, int], ...] = ()
    """A head's most recently used stored prompt prefixes: each one's last chain link and its
    length in blocks (``session.kv_store``); hashes of prompts, never their content."""
    prefix: PrefixFigures | None = None
    """The node's prefix store figures, for the status page (None: not reported)."""

    def __post_init__(self) -> None:
        if len(self.prefix_tips) > MAX_PREFIX_TIPS:
            raise InvalidArgument(f"at most {MAX_PREFIX_TIPS} prefix tips, got {len(self.prefix_tips)}")
        for link, blocks in self.prefix_tips:
            check_chain((link,))
            check_count("prefix tip blocks", blocks, MAX_CHAIN_BLOCKS, low=1)
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
    """A chain of shards of one recipe whose half-open ranges meet end to start, from layer 0 to
    the last; each hop carries its node's capability (``core.node_record.NodeCapability``)."""

    hops: tuple[RouteHop, ...]
    epoch: int
    """Epoch the route was issued at; a changed route for a session always has a larger one."""
    model: str
    quantization: str
    fingerprint: str
    n_layers: int
    ms_per_token: float
    """The planner's estimate, for telemetry; not a promise."""
    ticket: SealedTicket | None = None
    """The tracker's ticket for the session the route was asked for (``core.tickets``); None for
    a route asked without a session (a probe), which opens nothing."""

    def __post_init__(self) -> None:
        if not self.hops:
            raise InvalidArgument("a route needs at least one hop")
        for before, after in zip(self.hops, self.hops[1:], strict=False):
            if before.layers.stop != after.layers.start:
                raise InvalidArgument(
                    f"route hops {before.layers} and {after.layers} do not meet: a route must be contiguous"
                )
        self.layers.check_within(self.n_layers)
        if self.hops[0].layers.start != 0:
            raise InvalidArgument(f"route starts at layer {self.hops[0].layers.start}, not 0")
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

    @property
    def context_tokens(self) -> int:
        """Positions a session holds on this route: the least any of its hops holds."""
        return min(hop.capability.n_ctx_per_session for hop in self.hops)


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
    """Live nodes of this recipe (each passed the tracker's certification check to register)."""
    routable: bool
    """Their ranges chain over every layer, so a request can be served now."""
    head_sessions: int = 0
    """Sessions the nodes admit at once along a route: per layer, the sessions of the
    nodes covering it, summed; the least of those is the swarm's slots (the name is the wire's)."""


@dataclass(frozen=True)
class RouteQuery:
    """What a caller asks ``ChooseRoute`` for."""

    model: str
    """Model name or recipe fingerprint."""
    session_id: SessionId | None = None
    exclude: frozenset[NodeId] = frozenset()
    request_id: RequestId | None = None
    """With ``session_id``: the user request the route serves (its work record's id), the one
    request its ticket is for; None: an audit replay, or any request of the session."""
    ticket_seconds: float = 0.0
    """With ``session_id``: how long the ticket should last (``core.tickets.ticket_seconds``); 0:
    the tracker's default."""
    unbilled: bool = False
    """An audit replay: no work record follows, so the tracker expects (and bills) none. Nothing
    of it reaches the route's nodes, whose ticket is a user request's."""
    prefix_chain: tuple[bytes, ...] = ()
    """The prompt's prefix chain (``core.prefix``), at most ``MAX_ROUTE_CHAIN`` links: the
    tracker prefers a route whose head holds a prefix of it, and keeps a conversation on its route."""

    def __post_init__(self) -> None:
        if len(self.prefix_chain) > MAX_ROUTE_CHAIN:
            raise InvalidArgument(f"a route request carries at most {MAX_ROUTE_CHAIN} prefix links")
        check_chain(self.prefix_chain)


@dataclass(frozen=True)
class SessionTokens:
    """What one shard computed for one session that ended on it (``ReportSessionTokens``)."""

    session_id: SessionId
    route_epoch: int
    positions: int
    """Positions it appended to the session's KV: the prompt and every token fed back."""
    prompt_tokens: int
    """Positions before the first sampled token (0: it saw no token sampled)."""

    def __post_init__(self) -> None:
        check_text("session_id", self.session_id)
        check_count("route_epoch", self.route_epoch, MAX_TOKENS)
        check_count("positions", self.positions, MAX_TOKENS)
        check_count("prompt_tokens", self.prompt_tokens, self.positions)


@dataclass(frozen=True)
class Registered:
    """The tracker's answer to a registration."""

    node_id: NodeId
    heartbeat_interval_s: float
    epoch: int
    reachability: Reachability = "public"
    """What the tracker registered the node as (``core.reachability``): a node told ``private``
    is not routed, and attaches to a relay if it has one (``--reachability auto``)."""


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
    evidence: QuarantineEvidence | None = None
    """The audit's runs that isolate the node; a gateway's order without it is refused."""

    def __post_init__(self) -> None:
        check_text("node_id", self.node_id)
        if self.clear and self.evidence is not None:
            raise InvalidArgument("lifting a quarantine carries no evidence")
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


MAX_ROUTE_HOPS = 256
"""Hops one route timing may name: far more than any route has (one per layer at most)."""


@dataclass(frozen=True)
class RouteTiming:
    """What a gateway measured serving one request on one route: its decode time per token.

    The tracker's measure of node speeds (``tracker.speeds``): a route the tracker chose, timed
    end to end by the party that drove it, bounds what its hops can claim together."""

    hops: tuple[NodeId, ...]
    """The route's nodes, head first, as the tracker handed them out."""
    decode_ms_per_token: float
    """Milliseconds between consecutive generated tokens, averaged over the request."""
    tokens: int
    """Generated tokens the average spans (at least 2: one gap)."""

    def __post_init__(self) -> None:
        if not 1 <= len(self.hops) <= MAX_ROUTE_HOPS:
            raise InvalidArgument(f"a route timing names 1 to {MAX_ROUTE_HOPS} hops, got {len(self.hops)}")
        for node_id in self.hops:
            check_text("hop node_id", node_id)
        if len(set(self.hops)) != len(self.hops):
            raise InvalidArgument("a route timing names a node twice")
        check_finite("decode_ms_per_token", self.decode_ms_per_token, high=600_000.0)
        check_count("tokens", self.tokens, MAX_TOKENS, low=2)


HeartbeatTransport = Literal["stream", "unary"]
"""How a node heartbeats: on one ``Tracker.Beat`` stream per tracker replica (the default: half
the tracker's cost per beat over mTLS) or with unary ``Heartbeat`` calls (``membership.beat_streams``)."""
DEFAULT_HEARTBEAT_TRANSPORT: HeartbeatTransport = "stream"


PREFILL_WEIGHT = 0.25
"""Billing: a prompt token costs a quarter of a generated one (prefill is batched, decode is not)."""


def billing_units(prompt_tokens: int, completion_tokens: int) -> float:
    """What a request's work record bills (the gateway writes it, the tracker checks it)."""
    return PREFILL_WEIGHT * prompt_tokens + completion_tokens
