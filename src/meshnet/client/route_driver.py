"""Drive one generation along a route of shards: chunked prefill, then one decode step per token.

The driver talks only to the head; each shard forwards its boundary to the next, the tail
samples, and the token travels back. Every frame carries the remaining budget, so the route
never works past the request's deadline. Closing the iterator (or cancelling its task) cancels
the head stream, which frees the session's KV on every shard down the route.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import numpy as np

from meshnet.client.shard_admin import fetch_capability
from meshnet.client.shard_stream import ChannelPool, ShardStream
from meshnet.core.errors import DeadlineExceeded, IntegrityError, InvalidArgument
from meshnet.core.events import (
    DecodeStarted,
    GenerationEvent,
    PrefillCompleted,
    PrefillStarted,
    RouteHop,
    TokenGenerated,
)
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import RequestId, SessionId
from meshnet.protocol.convert import split_prefill
from meshnet.protocol.frames import CapabilityInfo, Continuation, FrameMeta, HopSpec, StepFrame, StepResult

RATE_WINDOW = 16
"""Tokens over which the rolling tokens/s is measured."""


@dataclass(frozen=True)
class RouteSession:
    """Where one generation runs: the hops and the identity every frame must carry."""

    request_id: RequestId
    session_id: SessionId
    hops: tuple[RouteHop, ...]
    fingerprint: str
    epoch: int


@dataclass(frozen=True)
class Progress:
    """What the driver knows after each token: for failover replay and billing."""

    generated: tuple[int, ...]
    next_position: int


class RouteDriver:
    def __init__(self, pool: ChannelPool, *, max_frame_bytes: int, head_driven: bool = True) -> None:
        self._pool = pool
        self._head_driven = head_driven
        self._max_frame_bytes = max_frame_bytes
        self._capabilities: dict[str, CapabilityInfo] = {}

    async def capability(self, address: str) -> CapabilityInfo:
        cached = self._capabilities.get(address)
        if cached is None:
            cached = await fetch_capability(self._pool, address)
            self._capabilities[address] = cached
        return cached

    async def run(
        self,
        route: RouteSession,
        request: GenerationRequest,
        *,
        history: Sequence[int] = (),
    ) -> AsyncIterator[GenerationEvent]:
        """Yield prefill/decode events and one TokenGenerated per new token.

        ``history`` holds tokens already generated on an earlier route: they are replayed after
        the prompt, so a failover continues exactly where the lost route stopped.
        """
        if not route.hops:
            raise InvalidArgument("a route needs at least one hop")
        deadline = None if request.timeout_s is None else time.monotonic() + request.timeout_s
        head = route.hops[0]
        head_capability = await self.capability(head.address)
        stream = ShardStream(self._pool, head.address, _remaining(deadline))
        try:
            async for event in self._generate(route, request, history, deadline, stream, head_capability):
                yield event
        finally:
            stream.cancel()

    async def _generate(
        self,
        route: RouteSession,
        request: GenerationRequest,
        history: Sequence[int],
        deadline: float | None,
        stream: ShardStream,
        head: CapabilityInfo,
    ) -> AsyncIterator[GenerationEvent]:
        prompt = np.asarray(request.prompt_tokens, dtype=np.int32)
        # Hidden frames between shards carry as many rows as this token frame, so size the
        # chunks for the boundary tensor, not for the token ids.
        rows_per_frame = max(1, (self._max_frame_bytes - 65536) // (4 * head.n_embd))
        chunks = split_prefill(
            prompt, 0, self._max_frame_bytes, max_tokens=min(rows_per_frame, head.max_tokens_per_frame)
        )
        downstream = tuple(HopSpec(h.address, h.layers, route.fingerprint) for h in route.hops[1:])
        yield PrefillStarted(len(prompt) + len(history))
        started = time.perf_counter()
        # The last frame we send asks the head to decode on by itself (head-driven decode), so
        # from then on we only read: our round trip leaves the per-token critical path.
        budget = request.max_tokens - len(history) - 1
        plan = Continuation(budget, request.stop_tokens) if self._head_driven and budget > 0 else None
        result: StepResult | None = None
        for step, chunk in enumerate(chunks):
            meta = route_frame_meta(route, step, chunk.position, "prefill", deadline)
            frame = StepFrame(
                meta=meta,
                tokens=np.ascontiguousarray(chunk.payload),
                downstream=downstream if step == 0 else (),
                sampling=request.sampling if step == 0 else None,
                final_chunk=chunk.final_chunk,
                continuation=plan if chunk.final_chunk and not history else None,
            )
            result = await stream.exchange(frame)
        step = len(chunks)
        # Replay: feed each earlier token as the one-token decode step it was, so every shard
        # computes exactly what the lost route computed (a prefill of them would take other
        # kernel paths). The tail re-samples each; a mismatch means the routes differ.
        for index, token in enumerate(history):
            if result is None or result.token_id != token:
                raise IntegrityError(
                    f"replay diverged at position {None if result is None else result.next_position}: the new route "
                    f"sampled {None if result is None else result.token_id}, the lost route had {token}"
                )
            meta = route_frame_meta(route, step, result.next_position, "decode", deadline)
            last = index == len(history) - 1
            frame = StepFrame(meta=meta, tokens=np.array([token], np.int32), continuation=plan if last else None)
            result = await stream.exchange(frame)
            step += 1
        yield PrefillCompleted(len(prompt) + len(history), time.perf_counter() - started)
        yield DecodeStarted()
        produced = len(history)
        stamps: list[float] = []
        while result is not None and result.token_id is not None:
            token = result.token_id
            stamps.append(time.perf_counter())
            stamps = stamps[-RATE_WINDOW:]
            rate = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
            yield TokenGenerated(token, produced, rate)
            produced += 1
            if token in request.stop_tokens or produced >= request.max_tokens:
                return
            if plan is not None:
                result = await stream.read()
            else:
                meta = route_frame_meta(route, step, result.next_position, "decode", deadline)
                result = await stream.exchange(StepFrame(meta=meta, tokens=np.array([token], np.int32)))
            step += 1


def route_frame_meta(
    route: RouteSession, step: int, position: int, phase: str, deadline: float | None = None
) -> FrameMeta:
    """The header of step ``step`` of ``route``'s session, as the head receives it."""
    remaining = _remaining(deadline)
    if remaining is not None and remaining <= 0:
        raise DeadlineExceeded("the request's deadline passed")
    return FrameMeta(
        request_id=route.request_id,
        session_id=route.session_id,
        route_epoch=route.epoch,
        fingerprint=route.fingerprint,
        layers=route.hops[0].layers,
        phase=phase,  # type: ignore[arg-type]
        position=position,
        step=step,
        cache="new" if step == 0 else "continue",
        deadline_ms=None if remaining is None else max(int(remaining * 1000), 1),
    )


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()
