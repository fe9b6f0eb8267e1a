"""What one choice shows its client: the route's items turned into text deltas and telemetry.

The route decides how a request ends (``route.life``); the gateway lends it a ``GatewayText``
plug (its tokenizer's incremental decoder and the stop matcher) and shows what comes back. A
``ChoiceView`` is the per-choice translation state: it shapes logprobs, throttles ``progress``
telemetry, publishes every milestone to the hub and passes the ``Outcome`` or ``Failure`` on.
It never decides a finish itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from meshnet.core.events import (
    DecodeStarted,
    PrefillCompleted,
    PrefillProgress,
    PrefillStarted,
    RouteAccepted,
    RouteHealth,
)
from meshnet.core.ids import RequestId
from meshnet.gateway.config import GatewayConfig
from meshnet.gateway.errors import streamed_error
from meshnet.gateway.logprob_format import LogprobEntry, logprob_entry
from meshnet.gateway.ports import TextCodec
from meshnet.gateway.responses import usage_json
from meshnet.gateway.stops import StopMatcher
from meshnet.gateway.telemetry_hub import TelemetryEvent, TelemetryHub, TelemetryKind
from meshnet.route.life import Failure, LifeItem, Outcome, RouteNote, TextPiece, TokenText

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TextDelta:
    text: str
    logprobs: tuple[LogprobEntry, ...] = ()
    """The token's logprobs, when the request asked for them."""


ShownItem = TextDelta | TelemetryEvent | Outcome | Failure
"""What a choice shows: text, a telemetry event, and at the end its outcome or failure."""


class GatewayText:
    """The ``route.life.TextPlug`` the gateway lends each choice: tokens to text, stop strings found."""

    def __init__(self, codec: TextCodec, stop_sequences: tuple[str, ...]) -> None:
        self._decoder = codec.new_decoder()
        self._stops = StopMatcher(stop_sequences)

    def push(self, token_id: int) -> TextPiece:
        scan = self._stops.push(self._decoder.push(token_id))
        return TextPiece(scan.emit, scan.stopped)

    def flush(self) -> str:
        return self._stops.push(self._decoder.flush()).emit + self._stops.flush()


def progress_due(tokens: int, last_tokens: int, now: float, last_at: float, config: GatewayConfig) -> bool:
    """Throttle for ``progress`` telemetry: every N tokens or every interval, whichever first."""
    if tokens <= last_tokens:
        return False
    return tokens - last_tokens >= config.progress_every_tokens or now - last_at >= config.progress_interval_seconds


def accepted_payload(event: RouteAccepted, queue_seconds: float = 0.0) -> dict[str, Any]:
    return {
        "queue_seconds": queue_seconds,
        "session_id": event.session_id,
        "model": event.model,
        "quantization": event.quantization,
        "epoch": event.epoch,
        "numerics": event.numerics,
        "cached_tokens": event.cached_tokens,
        "hops": [
            {"node_id": hop.node_id, "address": hop.address, "layers": str(hop.layers), "device": hop.capability.device}
            for hop in event.hops
        ],
    }


def prefill_progress_payload(event: PrefillProgress) -> dict[str, Any]:
    """Done/total tokens and an ETA extrapolated from the rate so far (None before any rate)."""
    remaining = event.total_tokens - event.done_tokens
    eta = event.seconds * remaining / event.done_tokens if event.done_tokens else None
    return {
        "done_tokens": event.done_tokens,
        "total_tokens": event.total_tokens,
        "seconds": round(event.seconds, 6),
        "eta_seconds": None if eta is None else round(eta, 3),
        "replay": event.replay,
    }


class ChoiceView:
    """Per-choice translation state; synchronous, so each item is handled atomically."""

    def __init__(
        self,
        request_id: RequestId,
        codec: TextCodec,
        hub: TelemetryHub,
        config: GatewayConfig,
        clock: Callable[[], float],
        queue_seconds: float,
    ) -> None:
        self.request_id = request_id
        self.ended = False
        """The route's ``Outcome`` or ``Failure`` was shown: nothing more comes for this choice."""
        self._codec = codec
        self._hub = hub
        self._config = config
        self._clock = clock
        self._queue_seconds = queue_seconds
        self._last_progress_tokens = 0
        self._last_progress_at = clock()

    def telemetry(self, kind: TelemetryKind, data: Mapping[str, Any]) -> list[ShownItem]:
        event = self._hub.publish(self.request_id, kind, data)
        return [] if event is None else [event]

    def take(self, item: LifeItem) -> list[ShownItem]:
        """What to show for one item the route pushed."""
        if isinstance(item, TokenText):
            return self._text(item)
        if isinstance(item, Outcome):
            self.ended = True
            data = {"finish_reason": item.finish_reason, "usage": usage_json(item.usage)}
            return [*self.telemetry("completed", data), item]
        if isinstance(item, Failure):
            self.ended = True
            return [*self.telemetry("failed", streamed_error(item.error, self.request_id)["error"]), item]
        return self._note(item)

    def _text(self, item: TokenText) -> list[ShownItem]:
        logprobs = () if item.logprobs is None else (logprob_entry(item.logprobs, self._codec),)
        self._hub.token(self.request_id, item.generated)
        if item.hops:
            self._hub.hop_times(item.hops)
        shown: list[ShownItem] = [TextDelta(item.text, logprobs)] if item.text or logprobs else []
        now = self._clock()
        if progress_due(item.generated, self._last_progress_tokens, now, self._last_progress_at, self._config):
            self._last_progress_tokens, self._last_progress_at = item.generated, now
            data = {"generated_tokens": item.generated, "tokens_per_second": item.tokens_per_second}
            shown += self.telemetry("progress", data)
        return shown

    def _note(self, note: RouteNote) -> list[ShownItem]:
        if isinstance(note, RouteAccepted):
            return self.telemetry("accepted", accepted_payload(note, self._queue_seconds))
        if isinstance(note, PrefillStarted):
            data = {"prompt_tokens": note.prompt_tokens, "cached_tokens": note.cached_tokens}
            return self.telemetry("prefill_started", data)
        if isinstance(note, PrefillProgress):
            return self.telemetry("prefill_progress", prefill_progress_payload(note))
        if isinstance(note, PrefillCompleted):
            return self.telemetry("prefill_completed", {"prompt_tokens": note.prompt_tokens, "seconds": note.seconds})
        if isinstance(note, DecodeStarted):
            return self.telemetry("decode_started", {})
        if isinstance(note, RouteHealth):
            return self.telemetry("route_health", {"status": note.status, "reason": note.reason})
        # The type only: an item's fields can carry generated tokens, which never go to logs.
        logger.warning("ignoring unknown route item %s", type(note).__name__)
        return []
