"""Serving one completion request: admission, deadline, and the streaming or whole response.

The endpoints in app.py parse and prepare; this module admits the request (at once, or after
waiting in the admission queue), runs the driver and
shapes its items into SSE chunks or one OpenAI object. It guarantees that whatever happens --
success, typed failure, deadline, client disconnect before or during the stream -- the route
iterator is closed and the admission slot returned exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from meshnet.core.errors import Cancelled, MeshnetError
from meshnet.core.ids import RequestId
from meshnet.gateway.admission import Admission, Lease, Refused
from meshnet.gateway.capacity import SwarmCapacity
from meshnet.gateway.config import GatewayConfig
from meshnet.gateway.driver import DriverItem, Outcome, TextDelta, drive
from meshnet.gateway.errors import HttpError, streamed_error
from meshnet.gateway.ports import RouteGenerator, TextCodec
from meshnet.gateway.prepare import ModelLimits, PreparedRequest, model_limits, unknown_model
from meshnet.gateway.responses import ChunkWriter, completion_object
from meshnet.gateway.sse import (
    DONE,
    KEEPALIVE,
    ManagedStreamingResponse,
    data_frame,
    telemetry_comment,
    with_keepalive,
)
from meshnet.gateway.telemetry_hub import TelemetryEvent, TelemetryHub

T = TypeVar("T")


@dataclass(frozen=True)
class Collected:
    text: str
    outcome: Outcome

    def as_tuple(self) -> tuple[str, Outcome]:
        return self.text, self.outcome


class CompletionService:
    """Everything one app needs to serve completions; built by ``create_app``, never global."""

    def __init__(
        self,
        generator: RouteGenerator,
        codecs: Mapping[str, TextCodec],
        config: GatewayConfig,
        *,
        hub: TelemetryHub,
        admission: Admission,
        capacity: SwarmCapacity,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        self.capacity = capacity
        self.generator = generator
        self.codecs = dict(codecs)
        self.config = config
        self.hub = hub
        self.admission = admission
        self.clock = clock
        self.wall_clock = wall_clock

    def resolve(self, model: str) -> tuple[TextCodec, ModelLimits]:
        codec = self.codecs.get(model)
        if codec is None:
            raise unknown_model(model, list(self.codecs))
        return codec, model_limits(model, codec, self.generator.models())

    async def respond(self, request: Request, prepared: PreparedRequest, codec: TextCodec) -> Response:
        request_id: RequestId = request.state.request_id
        await self.capacity.refresh_if_stale()
        lease, preamble = await self._admit(request, request_id, prepared.model)
        deadline = asyncio.get_running_loop().time() + self.config.request_timeout_seconds
        driver = drive(
            self.generator,
            prepared,
            codec,
            request_id,
            hub=self.hub,
            config=self.config,
            clock=self.clock,
            deadline=deadline,
            queue_seconds=lease.waited_s,
        )

        async def close() -> None:
            try:
                await driver.aclose()
            finally:
                lease.release()

        handed_off = False
        try:
            if prepared.stream:
                # Wait for the route's first event before sending headers, so a request that
                # finds no route still gets a proper HTTP status instead of a streamed error.
                first = await _first_item(driver)
                frames = self._sse(prepared, request_id, [*preamble, first], driver)
                response = ManagedStreamingResponse(frames, on_close=close)
                handed_off = True
                return response
            collected = await _unless_disconnected(request, _collect(driver))
            created = int(self.wall_clock())
            body = completion_object(prepared.kind, request_id, prepared.model, created, *collected.as_tuple())
            return JSONResponse(body)
        finally:
            if not handed_off:
                with anyio.CancelScope(shield=True):
                    await close()

    async def _admit(self, request: Request, request_id: RequestId, model: str) -> tuple[Lease, list[DriverItem]]:
        """A slot, after waiting in the queue if need be; the ``queued`` event, if it waited.

        A request refused at once gets no telemetry log: under overload those would evict the
        logs of the requests being served.
        """
        preamble: list[DriverItem] = []

        def on_queued(position: int) -> None:
            self.hub.open(request_id, model)
            place = {"position": position, "in_flight": self.admission.in_flight, "capacity": self.admission.capacity}
            event = self.hub.publish(request_id, "queued", place)
            preamble.extend([] if event is None else [event])

        wait = self.admission.acquire(self.config.queue_timeout_seconds, on_queued)
        try:
            lease = await _unless_disconnected(request, wait)
        except Refused as refused:
            error = HttpError(503, "overloaded", refused.message, retry_after=refused.retry_after)
            self._fail_waiting(request_id, error.code, error.message)
            raise error from None
        except BaseException as gone:  # client gone while waiting: its log must still end
            self._fail_waiting(request_id, "cancelled", f"left the queue: {gone!r}")
            raise
        if request_id not in self.hub:
            self.hub.open(request_id, model)
        return lease, preamble

    def _fail_waiting(self, request_id: RequestId, code: str, message: str) -> None:
        error = {"code": code, "message": message, "retryable": True, "request_id": request_id}
        self.hub.publish(request_id, "failed", error)

    async def _sse(
        self,
        prepared: PreparedRequest,
        request_id: RequestId,
        opening_items: list[DriverItem],
        driver: AsyncIterator[DriverItem],
    ) -> AsyncIterator[bytes]:
        writer = ChunkWriter(prepared.kind, request_id, prepared.model, int(self.wall_clock()))
        opening = writer.opening()
        if opening is not None:
            yield data_frame(opening)
        for early in opening_items[:-1]:
            for frame in _frames(writer, early, prepared.include_usage):
                yield frame
        try:
            for frame in _frames(writer, opening_items[-1], prepared.include_usage):
                yield frame
            async with contextlib.aclosing(with_keepalive(driver, self.config.keepalive_seconds)) as items:
                async for item in items:
                    if item is None:
                        yield KEEPALIVE
                        continue
                    for frame in _frames(writer, item, prepared.include_usage):
                        yield frame
        except Exception as err:  # typed or not, the client gets an error event, never a hang
            yield data_frame(streamed_error(err, request_id))
        yield DONE


def _frames(writer: ChunkWriter, item: DriverItem, include_usage: bool) -> list[bytes]:
    if isinstance(item, TextDelta):
        return [data_frame(writer.delta(item.text))]
    if isinstance(item, TelemetryEvent):
        return [telemetry_comment(item)]
    frames = [data_frame(writer.closing(item))]
    if include_usage:
        frames.append(data_frame(writer.usage(item)))
    return frames


async def _first_item(driver: AsyncIterator[DriverItem]) -> DriverItem:
    """The first item to stream; a failure before it propagates, to become an HTTP status."""
    try:
        item = await anext(driver)
        if isinstance(item, TelemetryEvent) and item.kind == "failed":
            # The driver announces a failure, then raises it: let it raise here, before headers.
            await anext(driver)
            raise MeshnetError("the route failed before its first event")
        return item
    except StopAsyncIteration:
        raise MeshnetError("the route produced nothing") from None


async def _collect(driver: AsyncIterator[DriverItem]) -> Collected:
    parts: list[str] = []
    outcome: Outcome | None = None
    # Run the driver to its end, not just to the Outcome, so the route can finish normally.
    async for item in driver:
        if isinstance(item, TextDelta):
            parts.append(item.text)
        elif isinstance(item, Outcome):
            outcome = item
    if outcome is None:
        raise MeshnetError("the route ended without an outcome")
    return Collected("".join(parts), outcome)


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` but cancel it if the client disconnects first (non-streaming requests).

    Starlette does not watch for disconnects while a plain endpoint runs; without this a client
    that gave up would keep a route session generating for nobody.
    """
    outcome: list[T] = []
    failure: list[BaseException] = []

    async with anyio.create_task_group() as group:

        async def run_work() -> None:
            try:
                outcome.append(await work)
            except Exception as err:  # re-raised below, outside the group, unwrapped
                failure.append(err)
            group.cancel_scope.cancel()

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            group.cancel_scope.cancel()

        group.start_soon(run_work)
        group.start_soon(watch)
    if failure:
        raise failure[0]
    if not outcome:
        raise Cancelled("the client disconnected before the completion was ready")
    return outcome[0]
