"""What every finished request leaves behind: one log line, latency histograms, live history.

The telemetry hub sees each request (each choice) from admission to its terminal event, so it
hands the ledger a ``RequestRecord`` there, the one place every request ends, whatever endpoint
made it. The ledger writes the operator's log line (never the key, only its id), observes TTFT
and inter-token latency for ``/metrics``, and adds the figures measured from served requests to
the status page's history: decode and prefill tok/s and inter-token latency of each request's
route, recorded under every node of that route (route figures by node: a slow hop is not told
apart, and a node on two routes shows their mean; ``hop_seconds`` is the per-node figure),
request and error rate, and admission's queue depth and requests in flight (sampled as
requests come and go and whenever the status view reads). The hub also hands it each hop's time
for the sampled decode steps of served requests (``route.hop_timing``): the per-node hop
histogram and history.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshnet.core.events import HopLatency
from meshnet.telemetry.histogram import Histogram
from meshnet.telemetry.history import History, HistoryShape

logger = logging.getLogger("meshnet.gateway.requests")


@dataclass(frozen=True)
class RequestRecord:
    """One request as it ended, with the timings the gateway measured (seconds since admission)."""

    request_id: str
    key_id: str | None
    model: str
    route: tuple[str, ...]
    """Node ids of the route's hops, head first (empty: it never got a route)."""
    prompt_tokens: int | None
    completion_tokens: int
    ttft_seconds: float | None
    total_seconds: float
    prefill_seconds: float | None
    decode_seconds: float | None
    """From the first token to the last (None with fewer than two tokens)."""
    outcome: str
    """``completed`` or ``failed``."""
    reason: str
    """The finish reason, or the error's code."""
    prefill_tokens: int | None = None
    """The prompt tokens computed in ``prefill_seconds`` (those reused from cache excluded)."""


def log_line(record: RequestRecord) -> str:
    """``request ID key=… model=… route=a,b prompt=N completion=N ttft=…s total=…s outcome=… reason=…``."""
    ttft = "-" if record.ttft_seconds is None else f"{record.ttft_seconds:.3f}s"
    prompt = "-" if record.prompt_tokens is None else str(record.prompt_tokens)
    return (
        f"request {record.request_id} key={record.key_id or '-'} model={record.model} "
        f"route={','.join(record.route) or '-'} prompt_tokens={prompt} "
        f"completion_tokens={record.completion_tokens} ttft={ttft} total={record.total_seconds:.3f}s "
        f"outcome={record.outcome} reason={record.reason}"
    )


def computed_prefill(events: Iterable[tuple[str, Mapping[str, Any]]]) -> tuple[int | None, float | None]:
    """(tokens, seconds) of a request's first prefill that completed, from its telemetry events.

    The tokens are those that prefill computed: its ``prefill_started`` total less the cached
    ones, which took no time. A failover's later prefill (the replay onto a new route) is a pair
    of its own, never mixed with the first: a rate from one pair's tokens and another's seconds
    would mean nothing."""
    started: Mapping[str, Any] | None = None
    for kind, data in events:
        if kind == "prefill_started":
            started = data
        elif kind == "prefill_completed" and started is not None:
            total, cached, seconds = (
                started.get("prompt_tokens"),
                started.get("cached_tokens") or 0,
                data.get("seconds"),
            )
            if isinstance(total, int) and isinstance(cached, int) and isinstance(seconds, int | float):
                return max(total - cached, 0), float(seconds)
            started = None
    return None, None


def rates(record: RequestRecord) -> tuple[float | None, float | None]:
    """(prefill tok/s, decode tok/s) measured on this request; None where it cannot tell."""
    prefill = None
    if record.prefill_seconds and record.prefill_tokens:
        prefill = record.prefill_tokens / record.prefill_seconds
    decode = None
    if record.decode_seconds and record.completion_tokens > 1:
        decode = (record.completion_tokens - 1) / record.decode_seconds
    return prefill, decode


class RequestLedger:
    """Histograms and history of one gateway; fed by its telemetry hub on one event loop."""

    def __init__(
        self, shape: HistoryShape, clock: Callable[[], float], gauges: Callable[[], Mapping[str, float]] = dict
    ) -> None:
        """``gauges``: admission's figures now (``queued``, ``in_flight``), sampled into the history."""
        self.history = History(shape)
        self._clock = clock
        self._gauges = gauges
        self.ttft = Histogram("time_to_first_token_seconds", "Time from admission to the first token.")
        self.inter_token = Histogram("inter_token_seconds", "Time between two tokens of one request.")
        self.duration = Histogram(
            "request_duration_seconds", "Time from admission to the end of a request, by outcome.", label="outcome"
        )
        self.hop = Histogram(
            "hop_seconds",
            "Time one hop of a route took over a decode step (a sample of the steps), by node id.",
            label="node",
            max_series=shape.max_labels,
        )

    @property
    def histograms(self) -> tuple[Histogram, ...]:
        return (self.ttft, self.inter_token, self.duration, self.hop)

    def hop_times(self, hops: Sequence[HopLatency]) -> None:
        """Each hop's time for one sampled decode step, by the hop's node id."""
        now = self._clock()
        for hop in hops:
            self.hop.observe(hop.seconds, hop.node_id)
            self.history.add("hop_seconds", hop.seconds, now, hop.node_id)

    def token_gap(self, seconds: float, route: Sequence[str]) -> None:
        now = self._clock()
        self.inter_token.observe(seconds)
        for node in route:
            self.history.add("inter_token_seconds", seconds, now, node)

    def sample_gateway(self) -> None:
        """Admission's gauges now (queue depth, requests in flight) into the history."""
        now, figures = self._clock(), self._gauges()
        for name in ("queued", "in_flight"):
            if name in figures:
                self.history.add(name, float(figures[name]), now)

    def finished(self, record: RequestRecord) -> None:
        logger.info("%s", log_line(record))
        self.sample_gateway()
        now = self._clock()
        self.duration.observe(record.total_seconds, record.outcome)
        if record.ttft_seconds is not None:
            self.ttft.observe(record.ttft_seconds)
            self.history.add("ttft_seconds", record.ttft_seconds, now)
        self.history.add("requests", 1.0, now)
        if record.outcome != "completed":
            self.history.add("errors", 1.0, now)
        prefill, decode = rates(record)
        for node in record.route:
            if prefill is not None:
                self.history.add("prefill_tokens_per_s", prefill, now, node)
            if decode is not None:
                self.history.add("decode_tokens_per_s", decode, now, node)

    def latest_rates(self) -> dict[str, dict[str, float]]:
        """Per node id, the mean prefill and decode tok/s of the latest bucket that measured them."""
        now = self._clock()
        latest: dict[str, dict[str, float]] = {}
        for metric in ("prefill_tokens_per_s", "decode_tokens_per_s"):
            for node, value in self.history.latest(metric, now).items():
                latest.setdefault(node, {})[metric] = value
        return latest

    def history_json(self) -> dict[str, Any]:
        """The history for ``/v1/status/history``, the same for every key, on purpose.

        The status document shows a non-admin key only its own requests and totals because those
        carry request ids, models, token counts, error messages and billing. The history holds
        none of that: gateway-wide aggregates per 5 s bucket (request and error rate, TTFT) and
        the swarm's load (per-node tok/s and latency, queue depth), which the document already
        shows every key in its node table and admission figures. A per-key history would cost a
        ring per key and hide from a customer the load their own requests wait behind."""
        self.sample_gateway()
        return self.history.as_json(self._clock())
