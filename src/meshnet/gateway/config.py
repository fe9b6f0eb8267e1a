"""The gateway's one typed configuration: limits, deadlines, telemetry cadence, bind address;
the process's (tracker, model) around it. ``meshnet gateway``'s flags are generated from them."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from meshnet.core.addresses import TrackerOrder, parse_address_list
from meshnet.core.config_flags import PROVISIONED_MODEL, cli
from meshnet.core.errors import InvalidArgument
from meshnet.core.limits import MAX_FRAME_BYTES


@dataclass(frozen=True)
class GatewayConfig:
    """Every knob the HTTP gateway reads; built once in ``main`` and passed to ``create_app``."""

    host: str = "127.0.0.1"
    """Bind address. Loopback by default: exposing the gateway is an explicit decision."""
    port: int = 8080
    """TCP port; 0 asks the OS for a free one (tests)."""
    default_max_tokens: int = 256
    """Completion budget when the request gives no ``max_tokens`` (clamped to the context)."""
    max_tokens_limit: int = 4096
    """Largest ``max_tokens`` a request may ask for; more is a 400, not a silent clamp."""
    max_stop_sequences: int = 4
    """How many ``stop`` strings one request may give (OpenAI's limit)."""
    max_choices: int = 8
    """Largest ``n``: each choice is its own route session, so one request holds up to this many."""
    max_body_bytes: int = 1 << 20
    """Request bodies above this are refused with 413 before being parsed."""
    max_in_flight: int | None = None
    """Requests admitted at once; unset: the swarm's session slots (the ``max_sessions`` of the
    shards serving layer 0, summed, as the tracker reports them; 8 until it has answered)."""
    max_queue: int | None = None
    """Requests that wait in line for a slot; beyond them an immediate 503 + Retry-After.
    Unset: 8 per slot in flight. 0 refuses at once whatever finds every slot taken."""
    queue_timeout_seconds: float = field(default=60.0, metadata=cli("queue-timeout"))
    """Longest one request waits in the queue; then it gets a 503 + Retry-After."""
    capacity_refresh_seconds: float = 10.0
    """How often unset limits are re-read from the tracker, as workers join and leave."""
    retry_after_seconds: int = 1
    """Retry-After on retryable 503s; the least one on overload, which adds the expected wait."""
    request_timeout_seconds: float = 300.0
    """Deadline of one request, from admission to its last token: 504 or a streamed timeout."""
    grammar_timeout_seconds: float = 10.0
    """Longest a ``json_schema`` grammar may take to build (in a child process, after the size
    bound from the schema): then a 400 ``grammar_too_complex``, and the child is replaced."""
    cancel_grace_seconds: float = 2.0
    """How long closing a route session (on disconnect, stop sequence, deadline) may take."""
    progress_every_tokens: int = 8
    """A ``progress`` telemetry event is sent at least every this many tokens ..."""
    progress_interval_seconds: float = 0.25
    """... or when this much time passed since the last one, whichever comes first."""
    telemetry_max_requests: int = 1024
    """Requests whose telemetry is kept for polling; the oldest finished are evicted first."""
    telemetry_max_events_per_request: int = 256
    """Events kept per request; old ``progress`` events are dropped first, milestones kept."""
    shutdown_grace_seconds: float = 10.0
    """On shutdown, in-flight requests get this long to finish before connections are closed."""
    tls_cert: Path | None = None
    """PEM certificate (chain) to serve HTTPS with; needs --tls-key. Unset: plain HTTP."""
    tls_key: Path | None = None
    """PEM private key of --tls-cert."""
    status_interval_seconds: float = field(default=0.5, metadata=cli("status-interval"))
    """The status stream sends at most one document per this interval, and the tracker's node
    table (for the page, ``/health`` and ``/v1/models``) is asked at most this often."""
    history_bucket_seconds: float = 5.0
    """The status page's charts: one point per this many seconds ..."""
    history_buckets: int = 120
    """... and this many points kept (by default ten minutes)."""
    keepalive_seconds: float = field(default=5.0, metadata=cli("keepalive"))
    """A completion stream with nothing else to send gets an SSE comment this often, so
    proxies and clients do not time out during a long prefill or failover replay."""

    def __post_init__(self) -> None:
        positive_ints = {
            "default_max_tokens": self.default_max_tokens,
            "max_tokens_limit": self.max_tokens_limit,
            "max_body_bytes": self.max_body_bytes,
            "max_choices": self.max_choices,
            "progress_every_tokens": self.progress_every_tokens,
            "telemetry_max_events_per_request": self.telemetry_max_events_per_request,
            "history_buckets": self.history_buckets,
        }
        for name, value in positive_ints.items():
            if value < 1:
                raise InvalidArgument(f"gateway config: {name} must be at least 1, got {value}")
        positive_floats = {
            "request_timeout_seconds": self.request_timeout_seconds,
            "grammar_timeout_seconds": self.grammar_timeout_seconds,
            "cancel_grace_seconds": self.cancel_grace_seconds,
            "progress_interval_seconds": self.progress_interval_seconds,
            "queue_timeout_seconds": self.queue_timeout_seconds,
            "capacity_refresh_seconds": self.capacity_refresh_seconds,
            "status_interval_seconds": self.status_interval_seconds,
            "keepalive_seconds": self.keepalive_seconds,
            "history_bucket_seconds": self.history_bucket_seconds,
        }
        for name, number in positive_floats.items():
            if not number > 0:
                raise InvalidArgument(f"gateway config: {name} must be positive, got {number}")
        if self.max_stop_sequences < 0 or self.retry_after_seconds < 0:
            raise InvalidArgument("gateway config: stop count and Retry-After cannot be negative")
        if self.shutdown_grace_seconds < 0:
            raise InvalidArgument("gateway config: shutdown_grace_seconds cannot be negative")
        if self.default_max_tokens > self.max_tokens_limit:
            raise InvalidArgument(
                f"gateway config: default_max_tokens {self.default_max_tokens} exceeds "
                f"max_tokens_limit {self.max_tokens_limit}"
            )
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise InvalidArgument(f"gateway config: max_in_flight must be at least 1, got {self.max_in_flight}")
        if self.max_queue is not None and self.max_queue < 0:
            raise InvalidArgument(f"gateway config: max_queue cannot be negative, got {self.max_queue}")
        # Every admitted or waiting request keeps a telemetry log, so eviction can always find a
        # finished one only if the hub holds more requests than can be admitted and wait at once.
        if self.max_in_flight is not None and self.max_queue is not None:
            held = self.max_in_flight + self.max_queue
            if self.telemetry_max_requests <= held:
                raise InvalidArgument(
                    "gateway config: telemetry_max_requests must exceed max_in_flight + max_queue, got "
                    f"{self.telemetry_max_requests} <= {held}"
                )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidArgument("gateway config: --tls-cert and --tls-key go together")
        if not 0 <= self.port <= 65535:
            raise InvalidArgument(f"gateway config: port must be in [0, 65535], got {self.port}")


@dataclass(frozen=True)
class GatewayProcessConfig:
    """``meshnet gateway``'s configuration; its flags are generated from these fields."""

    tracker: str
    """Tracker address (host:port) that routes requests to workers, or its replicas
    (a:7070,b:7070: a route call lost with one replica is asked of the next)."""
    http: GatewayConfig
    """The HTTP app's limits, deadlines and bind address."""
    data_dir: Path
    """Holds the outbox of work records (``gateway/outbox.sqlite3``); one gateway per directory.
    Set from the global --data-dir."""
    tracker_order: TrackerOrder = "spread"
    """Order the gateway asks --tracker replicas in: spread (its own, ranked by its certificate's
    name, so gateways spread over the replicas) or listed (first listed first)."""
    model: Path | None = field(default=None, metadata=cli(shown_default=PROVISIONED_MODEL))
    """GGUF the tokenizer and chat template are read from (no tensors are loaded): the source,
    or its vocabulary-only copy. Not with --model-id."""
    model_id: str | None = None
    """Serve this published model: fetch only its tokenizer artifact (a vocabulary-only GGUF of a
    few MB) from the holders the tracker names, checked against the signed manifest."""
    trust_publisher: str | None = None
    """With --model-id: accept only manifests this key fingerprint signed; none trusts the first key seen."""
    model_name: str | None = None
    """Name the model is served under; none: the published name (--model-id), else the file's stem."""
    max_frame_bytes: int = MAX_FRAME_BYTES
    """Largest gRPC message sent to or accepted from a shard."""
    chat_template: Path | None = None
    """Jinja chat template file used instead of the GGUF's; a model with neither (a base model)
    answers chat requests with a 400 and serves completions only."""
    audit_fraction: float = 0.05
    """Share of completed requests re-run on other nodes to verify their tokens (0 disables,
    1 audits every one); a node whose output disagrees is quarantined by the tracker."""
    audit_queue: int = 64
    """Sampled requests waiting for their audit; beyond it audits are dropped, never requests."""
    outbox_limit: int = 100_000
    """Work records waiting for the tracker's acknowledgement past which /metrics shows
    outbox_over_limit and a warning is logged. Records are still kept beyond it (none is ever
    dropped) and requests still served: refusing users would not file one record more."""
    warm_turns: bool = True
    """Once a turn completes, send its prompt and answer through the route once more as a prompt
    (unbilled, in the user's reading time), so the next turn of the conversation prefills only its
    new message (``route.warmup``); off, each turn prefills the last answer again."""
    allow_anonymous: bool = False
    """Serve /v1 without API keys. Loopback binds only (development); by default every /v1
    request needs a key of DATA_DIR/api-keys.sqlite3 (`meshnet swarm api-key create`)."""

    def __post_init__(self) -> None:
        parse_address_list(self.tracker)
        if (self.model is None) == (self.model_id is None):
            raise InvalidArgument("gateway config: give either --model or --model-id (not both)")
        if self.trust_publisher is not None and self.model_id is None:
            raise InvalidArgument("gateway config: --trust-publisher goes with --model-id")
        if not 0 <= self.audit_fraction <= 1 or self.audit_queue < 1:
            raise InvalidArgument("gateway config: --audit-fraction must be in [0, 1] and --audit-queue at least 1")
        if self.outbox_limit < 1:
            raise InvalidArgument(f"gateway config: --outbox-limit must be at least 1, got {self.outbox_limit}")
        if self.allow_anonymous and not is_loopback(self.http.host):
            raise InvalidArgument(
                f"gateway config: --allow-anonymous is for loopback only, not for host {self.http.host!r}"
            )


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


DEFAULT_SLOTS = 8
"""Slots assumed while the tracker has not said how many the swarm has."""
QUEUE_PER_SLOT = 8
"""Default queue places per slot in flight (TGI waits up to 128 requests; we scale with slots)."""


def admission_limits(config: GatewayConfig, swarm_slots: int | None) -> tuple[int, int]:
    """Slots in flight and queue places: the configured ones, else derived from the swarm's slots.

    Derived limits are capped so the telemetry hub can always hold every admitted and waiting
    request (see ``GatewayConfig``); configured ones were checked against it already.
    """
    room = config.telemetry_max_requests - 1
    in_flight = config.max_in_flight
    if in_flight is None:
        in_flight = min(max(swarm_slots or DEFAULT_SLOTS, 1), room)
    queue = config.max_queue
    if queue is None:
        queue = max(0, min(QUEUE_PER_SLOT * in_flight, room - in_flight))
    return in_flight, queue
