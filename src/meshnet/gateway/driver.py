"""Runs one prepared request against the route generator: tokens -> text, events -> telemetry.

The driver is shared by every endpoint and both response shapes. It turns the generator's
events into ``TextDelta``s (decoded, stop sequences removed), telemetry events (also published
to the hub) and one final ``Outcome``; failures stay typed ``MeshnetError``s. It owns the route
iterator: whatever ends the request early (stop sequence, deadline, client gone) closes it, and
that close is what cancels the route session upstream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import anyio

from meshnet.core.errors import Cancelled, DeadlineExceeded, MeshnetError
from meshnet.core.events import (
    DecodeStarted,
    Finished,
    GenerationEvent,
    PrefillCompleted,
    PrefillProgress,
    PrefillStarted,
    RouteAccepted,
    RouteHealth,
    TokenGenerated,
)
from meshnet.core.ids import RequestId
from meshnet.gateway.config import GatewayConfig
from meshnet.gateway.errors import streamed_error
from meshnet.gateway.logprob_format import LogprobEntry, logprob_entry
from meshnet.gateway.ports import RouteGenerator, TextCodec
from meshnet.gateway.prepare import PreparedRequest
from meshnet.gateway.stops import StopMatcher
from meshnet.gateway.telemetry_hub import TelemetryEvent, TelemetryHub, TelemetryKind
from meshnet.route.swarm import billing_units

logger = logging.getLogger(__name__)

OpenAIFinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class TextDelta:
    text: str
    logprobs: tuple[LogprobEntry, ...] = ()
    """The tokens since the last delta, when the request asked for logprobs."""


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    billing_units: float
    """From the route's ``Finished``; computed here when the gateway stopped the route first."""

    def __add__(self, other: Usage) -> Usage:
        """Two choices of one request: the prompt once, the completions and billing summed."""
        return Usage(
            self.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.billing_units + other.billing_units,
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "billing_units": self.billing_units,
        }


@dataclass(frozen=True)
class Outcome:
    finish_reason: OpenAIFinishReason
    usage: Usage


DriverItem = TextDelta | TelemetryEvent | Outcome


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
        "hops": [{"node_id": hop.node_id, "address": hop.address, "layers": str(hop.layers)} for hop in event.hops],
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


class _Run:
    """Per-request translation state; synchronous, so each event is handled atomically."""

    def __init__(
        self,
        prepared: PreparedRequest,
        codec: TextCodec,
        request_id: RequestId,
        hub: TelemetryHub,
        config: GatewayConfig,
        clock: Callable[[], float],
        queue_seconds: float,
    ) -> None:
        self.queue_seconds = queue_seconds
        self.prepared = prepared
        self.request_id = request_id
        self.hub = hub
        self.config = config
        self.clock = clock
        self.decoder = codec.new_decoder()
        self.codec = codec
        self.eos = codec.eos_token_ids
        self.stops = StopMatcher(prepared.stop_sequences)
        self.tokens = 0
        self.route_finished = False
        self.text_ended = False
        """EOS seen or max_tokens reached: later tokens are not text; wait for ``Finished``."""
        self.rate = 0.0
        self.last_progress_tokens = 0
        self.last_progress_at = clock()

    def telemetry(self, kind: TelemetryKind, data: Mapping[str, Any]) -> list[DriverItem]:
        event = self.hub.publish(self.request_id, kind, data)
        return [] if event is None else [event]

    def handle(self, event: GenerationEvent) -> tuple[list[DriverItem], bool]:
        """Items to emit for one event, and whether the request is now complete."""
        if isinstance(event, TokenGenerated):
            return self._token(event)
        if isinstance(event, Finished):
            reason: OpenAIFinishReason = "length" if event.reason == "length" else "stop"
            if event.reason in ("cancelled", "error"):
                raise MeshnetError(f"the route ended the generation with reason {event.reason!r}")
            usage = Usage(event.prompt_tokens, event.completion_tokens, event.billing_units)
            self.route_finished = True
            return self._finish(reason, usage), True
        if isinstance(event, RouteAccepted):
            return self.telemetry("accepted", accepted_payload(event, self.queue_seconds)), False
        if isinstance(event, PrefillStarted):
            return self.telemetry("prefill_started", {"prompt_tokens": event.prompt_tokens}), False
        if isinstance(event, PrefillProgress):
            return self.telemetry("prefill_progress", prefill_progress_payload(event)), False
        if isinstance(event, PrefillCompleted):
            prefill = {"prompt_tokens": event.prompt_tokens, "seconds": event.seconds}
            return self.telemetry("prefill_completed", prefill), False
        if isinstance(event, DecodeStarted):
            return self.telemetry("decode_started", {}), False
        if isinstance(event, RouteHealth):
            health = {"status": event.status, "reason": event.reason}
            return self.telemetry("route_health", health), False
        # The type only: an event's fields can carry generated tokens, which never go to logs.
        logger.warning("ignoring unknown generation event %s", type(event).__name__)
        return [], False

    def _token(self, event: TokenGenerated) -> tuple[list[DriverItem], bool]:
        if self.text_ended:
            return [], False
        if event.token_id in self.eos:
            # EOS is not text. The route knows it too (stop_tokens) and reports Finished with the
            # authoritative usage and billing, so keep reading rather than cutting it off.
            self.text_ended = True
            return [], False
        self.tokens += 1
        self.rate = event.tokens_per_second
        scan = self.stops.push(self.decoder.push(event.token_id))
        logprobs = () if event.logprobs is None else (logprob_entry(event.logprobs, self.codec),)
        items: list[DriverItem] = [TextDelta(scan.emit, logprobs)] if scan.emit or logprobs else []
        now = self.clock()
        last_tokens, last_at = self.last_progress_tokens, self.last_progress_at
        if progress_due(self.tokens, last_tokens, now, last_at, self.config):
            self.last_progress_tokens, self.last_progress_at = self.tokens, now
            data = {"generated_tokens": self.tokens, "tokens_per_second": self.rate}
            items += self.telemetry("progress", data)
        if scan.stopped:
            # The route cannot see stop strings: end here, and closing the iterator cancels it.
            return items + self._finish("stop", self._local_usage()), True
        if self.tokens >= self.prepared.generation.max_tokens:
            self.text_ended = True  # the route was given max_tokens and will report Finished
        return items, False

    def _local_usage(self) -> Usage:
        prompt = len(self.prepared.generation.prompt_tokens)
        return Usage(prompt, self.tokens, billing_units(prompt, self.tokens))

    def _finish(self, reason: OpenAIFinishReason, usage: Usage) -> list[DriverItem]:
        tail = self.stops.push(self.decoder.flush()).emit + self.stops.flush()
        items: list[DriverItem] = [TextDelta(tail)] if tail else []
        data = {"finish_reason": reason, "usage": usage.as_json()}
        items += self.telemetry("completed", data)
        items.append(Outcome(reason, usage))
        return items


async def drive(
    generator: RouteGenerator,
    prepared: PreparedRequest,
    codec: TextCodec,
    request_id: RequestId,
    *,
    hub: TelemetryHub,
    config: GatewayConfig,
    clock: Callable[[], float],
    deadline: float,
    queue_seconds: float = 0.0,
) -> AsyncGenerator[DriverItem, None]:
    """Yield the request's items until its ``Outcome``; raise a ``MeshnetError`` on failure.

    ``deadline`` is on the running loop's clock (``loop.time()``); ``queue_seconds`` is the time
    the request waited for admission, reported on ``accepted``.
    """
    run = _Run(prepared, codec, request_id, hub, config, clock, queue_seconds)
    events = generator.generate(prepared.generation, request_id)
    try:
        done = False
        while not done:
            event = await _next_event(events, deadline, config)
            items, done = run.handle(event)
            for item in items:
                yield item
        if run.route_finished:
            await _let_route_end(events, config.cancel_grace_seconds)
    except MeshnetError as err:
        # Yielded too, so a stream's telemetry always ends with `completed` or `failed`.
        for item in run.telemetry("failed", streamed_error(err, request_id)["error"]):
            yield item
        raise
    except (asyncio.CancelledError, GeneratorExit):
        gone = Cancelled("the request was cancelled (client gone or stream closed)")
        run.telemetry("failed", streamed_error(gone, request_id)["error"])
        raise
    except Exception as err:
        logger.exception("route generator failed for %s", request_id)
        for item in run.telemetry("failed", streamed_error(err, request_id)["error"]):
            yield item
        raise
    finally:
        await close_route(events, config.cancel_grace_seconds)


async def _next_event(
    events: AsyncIterator[GenerationEvent], deadline: float, config: GatewayConfig
) -> GenerationEvent:
    try:
        async with asyncio.timeout_at(deadline):
            return await anext(events)
    except StopAsyncIteration:
        raise MeshnetError("the route ended without reporting how it finished") from None
    except TimeoutError:
        raise DeadlineExceeded(f"the request exceeded its deadline of {config.request_timeout_seconds:g} s") from None


async def _let_route_end(events: AsyncIterator[GenerationEvent], grace_seconds: float) -> None:
    """After ``Finished``, let the iterator run to its end so the route sees a normal finish.

    Closing it at the ``Finished`` yield would look like a cancellation upstream; anything it
    sends after ``Finished`` is a contract breach, logged, and the iterator is closed anyway.
    """
    try:
        async with asyncio.timeout(grace_seconds):
            extra = await anext(events)
        logger.warning("the route sent %s after Finished; closing it", type(extra).__name__)
    except (StopAsyncIteration, TimeoutError):
        pass
    except Exception:
        logger.exception("the route failed after reporting Finished")


async def close_route(events: AsyncIterator[GenerationEvent], grace_seconds: float) -> None:
    """Close the route iterator, which cancels its session upstream; bounded and uncancellable.

    Shielded because this often runs while the request task is being cancelled (client gone),
    which is exactly when the route session must still be released.
    """
    aclose = getattr(events, "aclose", None)
    if aclose is None:
        return
    with anyio.CancelScope(shield=True), anyio.move_on_after(grace_seconds):
        try:
            await aclose()
        except Exception:
            logger.exception("closing the route session failed")
