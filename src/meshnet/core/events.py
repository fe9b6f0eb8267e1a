"""Generation events: what a route driver reports while it serves one request.

The route client feeds them to the request's life (``route.life``), which decides how the
request ends; the gateway shows them as SSE token deltas and Generation Telemetry. A failure is
not an event: the driver raises a typed ``MeshnetError`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeCapability
from meshnet.core.sampling_options import TokenLogprobs


@dataclass(frozen=True)
class RouteHop:
    """One node of a route, as the tracker built it from the node's record: where it is, which
    layers it runs, and what a request through it must respect (its context, its frame and
    chunk sizes), so the route client never has to ask the node."""

    node_id: NodeId
    address: str
    layers: LayerRange
    capability: NodeCapability


@dataclass(frozen=True)
class RouteAccepted:
    request_id: RequestId
    session_id: SessionId
    model: str
    quantization: str
    hops: tuple[RouteHop, ...]
    epoch: int
    numerics: str = "exact"
    """``exact``, or ``mixed`` with the measured drift of a route over several device classes
    (``core.devices.route_numerics``)."""
    cached_tokens: int = 0
    """Prompt tokens the route holds KV for and will not compute again (``route.kv_plan``)."""


@dataclass(frozen=True)
class PrefillStarted:
    prompt_tokens: int
    cached_tokens: int = 0
    """Prompt tokens whose KV every shard of the route restored instead of computing."""


@dataclass(frozen=True)
class PrefillCompleted:
    prompt_tokens: int
    seconds: float


@dataclass(frozen=True)
class PrefillProgress:
    """One prefill chunk (or one run of replayed tokens after a failover) went through the route."""

    done_tokens: int
    total_tokens: int
    seconds: float
    """Since the prefill started: with the counts, what an ETA is estimated from."""
    replay: bool = False
    """True while re-feeding tokens a lost route had generated."""


@dataclass(frozen=True)
class DecodeStarted:
    pass


@dataclass(frozen=True)
class HopLatency:
    """How long one hop of the route took over one decode step: the time from its receiving the
    step's frame to its output (engine queue and llama.cpp), as the shard measured it."""

    node_id: NodeId
    seconds: float


@dataclass(frozen=True)
class TokenGenerated:
    token_id: int
    index: int
    """0-based index among generated tokens."""
    tokens_per_second: float
    """Rolling decode rate over the recent window."""
    logprobs: TokenLogprobs | None = None
    """The tail's logprobs for this token, when the request asked for them."""
    hops: tuple[HopLatency, ...] = ()
    """Each hop's time for the decode step that produced this token, on a sample of the steps
    (``route.hop_timing``); empty on the others."""


@dataclass(frozen=True)
class RouteHealth:
    """Route status changes: a retry, a failover onto a replacement shard, a degraded hop."""

    status: str
    reason: str


GenerationEvent = (
    RouteAccepted | PrefillStarted | PrefillProgress | PrefillCompleted | DecodeStarted | TokenGenerated | RouteHealth
)
