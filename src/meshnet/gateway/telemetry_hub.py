"""Bounded in-memory log of Generation Telemetry, per request, for polling and following.

Each choice's view (``choice_view``) publishes its telemetry here as it happens;
``GET /v1/telemetry/{id}`` reads the folded snapshot and ``GET /v1/telemetry/{id}/events``
follows the log (replay, then live).
Both the number of requests kept and the events per request are bounded, so a busy gateway
cannot grow without limit: the oldest *finished* request is evicted first, and within a request
old ``progress`` events are dropped before milestones. One hub per app, owned by one event
loop, so no locks are needed.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from meshnet.core.events import HopLatency
from meshnet.core.ids import RequestId
from meshnet.gateway.request_ledger import RequestLedger, RequestRecord, computed_prefill

TelemetryKind = Literal[
    "queued",
    "accepted",
    "prefill_started",
    "prefill_progress",
    "prefill_completed",
    "decode_started",
    "progress",
    "route_health",
    "completed",
    "failed",
]
TERMINAL_KINDS: frozenset[str] = frozenset({"completed", "failed"})


@dataclass(frozen=True)
class TelemetryEvent:
    """One Generation Telemetry event; ``seq`` counts from 0 within its request."""

    request_id: RequestId
    seq: int
    kind: TelemetryKind
    at: float
    """Seconds since the request was admitted."""
    data: Mapping[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "seq": self.seq,
            "kind": self.kind,
            "at": round(self.at, 6),
            **self.data,
        }


@dataclass(frozen=True)
class TelemetrySnapshot:
    """The latest known state of one request, as the polling endpoint returns it."""

    request_id: RequestId
    model: str
    state: str = "admitted"
    """Kind of the last milestone (``progress`` only updates counters)."""
    route: Mapping[str, Any] | None = None
    queue_position: int | None = None
    """Place in the admission queue when the request had to wait (1: next in line)."""
    queue_seconds: float | None = None
    """Time spent in the admission queue, known once the route accepted the request."""
    prompt_tokens: int | None = None
    prefill_done_tokens: int = 0
    """Tokens through the route so far in the current prefill (or failover replay)."""
    prefill_eta_seconds: float | None = None
    replaying: bool = False
    failovers: int = 0
    generated_tokens: int = 0
    tokens_per_second: float = 0.0
    health: tuple[Mapping[str, Any], ...] = ()
    usage: Mapping[str, Any] | None = None
    finish_reason: str | None = None
    error: Mapping[str, Any] | None = None
    finished: bool = False
    last_seq: int = -1
    updated_at: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "health": [dict(note) for note in self.health],
        }


def fold_event(snapshot: TelemetrySnapshot, event: TelemetryEvent) -> TelemetrySnapshot:
    """Return the snapshot after ``event``: a pure reduction, so polling never races the log."""
    data = event.data
    changes: dict[str, Any] = {"last_seq": event.seq, "updated_at": event.at}
    if event.kind not in ("progress", "prefill_progress"):
        changes["state"] = event.kind
    if event.kind == "queued":
        changes["queue_position"] = data.get("position")
    elif event.kind == "accepted":
        changes["route"] = dict(data)
        changes["queue_seconds"] = data.get("queue_seconds", snapshot.queue_seconds)
    elif event.kind in ("prefill_started", "prefill_completed"):
        changes["prompt_tokens"] = data.get("prompt_tokens")
        done = data.get("prompt_tokens") if event.kind == "prefill_completed" else 0
        changes.update(prefill_done_tokens=done, prefill_eta_seconds=0.0 if done else None, replaying=False)
    elif event.kind == "prefill_progress":
        changes.update(
            prefill_done_tokens=data.get("done_tokens", 0),
            prefill_eta_seconds=data.get("eta_seconds"),
            replaying=bool(data.get("replay")),
        )
    elif event.kind == "progress":
        changes["generated_tokens"] = data.get("generated_tokens", snapshot.generated_tokens)
        changes["tokens_per_second"] = data.get("tokens_per_second", snapshot.tokens_per_second)
    elif event.kind == "route_health":
        changes["health"] = (*snapshot.health, dict(data))
        changes["failovers"] = snapshot.failovers + (data.get("status") == "failover")
    elif event.kind == "completed":
        usage = data.get("usage") or {}
        changes.update(
            finished=True,
            usage=dict(usage),
            finish_reason=data.get("finish_reason"),
            generated_tokens=usage.get("completion_tokens", snapshot.generated_tokens),
        )
    elif event.kind == "failed":
        changes.update(finished=True, error=dict(data))
    return dataclasses.replace(snapshot, **changes)


class _RequestLog:
    """Events and snapshot of one request; followers wait on ``changed``."""

    def __init__(self, request_id: RequestId, model: str, started_at: float, owner: str | None) -> None:
        self.owner = owner
        self.events: list[TelemetryEvent] = []
        self.snapshot = TelemetrySnapshot(request_id=request_id, model=model)
        self.started_at = started_at
        self.next_seq = 0
        self.finished = False
        # Created lazily by a follower so the hub never binds an event loop at construction.
        self.changed: asyncio.Event | None = None
        self.route: tuple[str, ...] = ()
        self.first_token_at: float | None = None
        self.tokens_seen = 0
        self.last_token_at: float | None = None

    def wake_followers(self) -> None:
        if self.changed is not None:
            self.changed.set()
            self.changed = None


class TelemetryHub:
    """Per-request telemetry logs, bounded in requests and in events per request."""

    def __init__(
        self,
        *,
        max_requests: int,
        max_events_per_request: int,
        clock: Callable[[], float],
        ledger: RequestLedger | None = None,
    ) -> None:
        self.ledger = ledger
        """Where each finished request's record goes (log line, histograms, history)."""
        self.totals: dict[str, float] = {}
        """Counters over finished requests, for /metrics."""
        self._owner_totals: dict[str | None, dict[str, float]] = {}
        """The same counters per owner (API key id): what a key's own status page shows."""
        self._max_requests = max_requests
        self._max_events = max_events_per_request
        self._clock = clock
        self._logs: dict[RequestId, _RequestLog] = {}
        self._finished_order: OrderedDict[RequestId, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._logs)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._logs

    def open(self, request_id: RequestId, model: str, owner: str | None = None) -> None:
        """Start the log of a newly admitted request, evicting to stay within the bound.

        ``owner`` is the id of the API key that made the request (None: made without keys).
        """
        while len(self._logs) >= self._max_requests:
            self._evict_one()
        self._logs[request_id] = _RequestLog(request_id, model, self._clock(), owner)
        if self.ledger is not None:
            self.ledger.sample_gateway()

    def owner(self, request_id: RequestId) -> str | None:
        log = self._logs.get(request_id)
        return None if log is None else log.owner

    def publish(self, request_id: RequestId, kind: TelemetryKind, data: Mapping[str, Any]) -> TelemetryEvent | None:
        """Append an event; returns it (with its ``seq``), or None if the request is not kept."""
        log = self._logs.get(request_id)
        if log is None or log.finished:
            return None
        event = TelemetryEvent(
            request_id=request_id,
            seq=log.next_seq,
            kind=kind,
            at=self._clock() - log.started_at,
            data=dict(data),
        )
        log.next_seq += 1
        self._append_bounded(log, event)
        log.snapshot = fold_event(log.snapshot, event)
        if kind == "accepted":
            log.route = tuple(str(hop.get("node_id", "")) for hop in data.get("hops") or ())
        if kind in TERMINAL_KINDS:
            log.finished = True
            self._finished_order[request_id] = None
            for totals in (self.totals, self._owner_totals.setdefault(log.owner, {})):
                _count_finished(totals, kind, data)
            if self.ledger is not None:
                self.ledger.finished(_record(log, event))
        log.wake_followers()
        return event

    def refused(self, request_id: RequestId, model: str, owner: str | None, code: str) -> None:
        """A request refused before it got a log (overload): its record only, nothing kept, so a
        flood of refusals cannot evict the logs of the requests being served."""
        if self.ledger is not None:
            record = RequestRecord(str(request_id), owner, model, (), None, 0, None, 0.0, None, None, "failed", code)
            self.ledger.finished(record)

    def token(self, request_id: RequestId, generated: int) -> None:
        """Token number ``generated`` of ``request_id`` reached its client: times TTFT and the gap
        since the last (text flushed at the end repeats the count and times nothing)."""
        log = self._logs.get(request_id)
        if log is None or log.finished or generated <= log.tokens_seen:
            return
        log.tokens_seen = generated
        now = self._clock()
        if log.first_token_at is None:
            log.first_token_at = now
        elif log.last_token_at is not None and self.ledger is not None:
            self.ledger.token_gap(now - log.last_token_at, log.route)
        log.last_token_at = now

    def hop_times(self, hops: Sequence[HopLatency]) -> None:
        """Each hop's time for a sampled decode step of a served request (to the ledger)."""
        if self.ledger is not None:
            self.ledger.hop_times(hops)

    def totals_of(self, owner: str | None) -> dict[str, float]:
        """The counters over the finished requests of one owner."""
        return dict(self._owner_totals.get(owner, {}))

    def snapshot(self, request_id: RequestId) -> TelemetrySnapshot | None:
        log = self._logs.get(request_id)
        return None if log is None else log.snapshot

    def recent(
        self, limit: int, visible: Callable[[str | None], bool] = lambda owner: True
    ) -> list[tuple[TelemetrySnapshot, float]]:
        """Up to ``limit`` requests whose owner is ``visible``, with their age in seconds: live
        ones first, then the latest finished ones (the status page's view)."""
        now = self._clock()
        live = [log for log in self._logs.values() if not log.finished]
        done = [self._logs[rid] for rid in reversed(self._finished_order) if rid in self._logs]
        shown = [log for log in [*live, *done] if visible(log.owner)]
        return [(log.snapshot, now - log.started_at) for log in shown[:limit]]

    async def follow(self, request_id: RequestId) -> AsyncIterator[TelemetryEvent]:
        """Yield the request's kept events, then new ones live, until its terminal event."""
        log = self._logs.get(request_id)
        if log is None:
            return
        cursor = 0
        while True:
            pending = [event for event in log.events if event.seq >= cursor]
            for event in pending:
                cursor = event.seq + 1
                yield event
            if pending:
                continue  # more may have arrived while the consumer held the last event
            if log.finished:
                return
            if log.changed is None:
                log.changed = asyncio.Event()
            await log.changed.wait()

    def _append_bounded(self, log: _RequestLog, event: TelemetryEvent) -> None:
        if len(log.events) >= self._max_events:
            # Milestones are few and each tells something; progress events are many and each
            # only refines a counter the snapshot already holds, so they go first.
            victim = next((i for i, kept in enumerate(log.events) if kept.kind == "progress"), 0)
            del log.events[victim]
        log.events.append(event)

    def _evict_one(self) -> None:
        if self._finished_order:
            victim, _ = self._finished_order.popitem(last=False)
        else:
            # Only reachable if the bound is below the admission cap; the config forbids that,
            # but dropping the oldest live log still keeps memory bounded.
            victim = next(iter(self._logs))
        log = self._logs.pop(victim)
        log.finished = True
        log.wake_followers()


def _count_finished(totals: dict[str, float], kind: str, data: Mapping[str, Any]) -> None:
    """Add one finished request (its terminal ``kind`` and usage) to ``totals``."""
    totals[f"requests_{kind}_total"] = totals.get(f"requests_{kind}_total", 0.0) + 1
    usage = data.get("usage") if isinstance(data.get("usage"), Mapping) else None
    if usage is not None:
        for key in ("prompt_tokens", "completion_tokens", "billing_units"):
            value = usage.get(key)
            if isinstance(value, int | float):
                totals[f"{key}_total"] = totals.get(f"{key}_total", 0.0) + float(value)


def _record(log: _RequestLog, end: TelemetryEvent) -> RequestRecord:
    """The ledger's record of a request whose terminal event is ``end``."""
    snapshot, first, last = log.snapshot, log.first_token_at, log.last_token_at
    prefill_tokens, prefill = computed_prefill((event.kind, event.data) for event in log.events)
    return RequestRecord(
        request_id=str(snapshot.request_id),
        key_id=log.owner,
        model=snapshot.model,
        route=log.route,
        prompt_tokens=snapshot.prompt_tokens or (snapshot.usage or {}).get("prompt_tokens"),
        completion_tokens=snapshot.generated_tokens,
        ttft_seconds=None if first is None else first - log.started_at,
        total_seconds=end.at,
        prefill_seconds=prefill,
        decode_seconds=None if first is None or last is None or last <= first else last - first,
        outcome=end.kind,
        reason=str(end.data.get("finish_reason") if end.kind == "completed" else end.data.get("code", "error")),
        prefill_tokens=prefill_tokens,
    )
