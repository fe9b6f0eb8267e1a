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
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from typing import TypeVar

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from meshnet.core.errors import Cancelled, MeshnetError
from meshnet.core.ids import RequestId
from meshnet.gateway.admission import Admission, Lease, Refused
from meshnet.gateway.capacity import SwarmCapacity
from meshnet.gateway.choices import choice_request_id, interleave
from meshnet.gateway.config import GatewayConfig
from meshnet.gateway.driver import DriverItem, Outcome, TextDelta, drive
from meshnet.gateway.errors import HttpError, streamed_error
from meshnet.gateway.logprob_format import LogprobEntry
from meshnet.gateway.ports import RouteGenerator, TextCodec
from meshnet.gateway.prepare import ModelLimits, PreparedRequest, model_limits, unknown_model
from meshnet.gateway.responses import ChunkWriter, Collected, completion_object
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
        leases = [lease]
        try:
            leases += await self._admit_more_choices(request, request_id, prepared.choices - 1)
        except BaseException:
            lease.release()
            raise
        deadline = asyncio.get_running_loop().time() + self.config.request_timeout_seconds
        waited = lease.waited_s
        drivers = [self._driver(prepared, codec, request_id, i, deadline, waited) for i in range(prepared.choices)]

        async def close() -> None:
            try:
                for driver in drivers:
                    await driver.aclose()
            finally:
                for held in leases:
                    held.release()

        handed_off = False
        try:
            if prepared.stream:
                # Wait for each route's first event before sending headers, so a request that
                # finds no route still gets a proper HTTP status instead of a streamed error.
                firsts = [await _first_item(driver) for driver in drivers]
                frames = self._sse(prepared, request_id, preamble, firsts, drivers)
                response = ManagedStreamingResponse(frames, on_close=close)
                handed_off = True
                return response
            collected = await _unless_disconnected(request, _collect_all(drivers, prepared.logprobs))
            created = int(self.wall_clock())
            body = completion_object(prepared.kind, request_id, prepared.model, created, collected)
            return JSONResponse(body)
        finally:
            if not handed_off:
                with anyio.CancelScope(shield=True):
                    await close()

    def _driver(
        self,
        prepared: PreparedRequest,
        codec: TextCodec,
        request_id: RequestId,
        index: int,
        deadline: float,
        queue_seconds: float,
    ) -> AsyncGenerator[DriverItem, None]:
        choice_id = choice_request_id(request_id, index)
        if index > 0:
            self.hub.open(choice_id, prepared.model)
        choice = replace(prepared, generation=prepared.choice_generation(index)) if index else prepared
        return drive(
            self.generator,
            choice,
            codec,
            choice_id,
            hub=self.hub,
            config=self.config,
            clock=self.clock,
            deadline=deadline,
            queue_seconds=queue_seconds,
        )

    async def _admit_more_choices(self, request: Request, request_id: RequestId, extra: int) -> list[Lease]:
        """One more admission slot per further choice: each is a route session of its own."""
        leases: list[Lease] = []
        try:
            for _ in range(extra):
                wait = self.admission.acquire(self.config.queue_timeout_seconds, lambda _position: None)
                leases.append(await _unless_disconnected(request, wait))
        except Refused as refused:
            for lease in leases:
                lease.release()
            raise HttpError(503, "overloaded", refused.message, retry_after=refused.retry_after) from None
        except BaseException:
            for lease in leases:
                lease.release()
            raise
        return leases

    async def _admit(self, request: Request, request_id: RequestId, model: str) -> tuple[Lease, list[DriverItem]]:
        """A slot, after waiting in the queue if need be; the ``queued`` event, if it waited.

        A request refused at once gets no telemetry log: under overload those would evict the
        logs of the requests being served.
        """
        preamble: list[DriverItem] = []
        owner: str | None = getattr(request.state, "api_key_name", None)

        def on_queued(position: int) -> None:
            self.hub.open(request_id, model, owner)
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
            self.hub.open(request_id, model, owner)
        return lease, preamble

    def _fail_waiting(self, request_id: RequestId, code: str, message: str) -> None:
        error = {"code": code, "message": message, "retryable": True, "request_id": request_id}
        self.hub.publish(request_id, "failed", error)

    async def _sse(
        self,
        prepared: PreparedRequest,
        request_id: RequestId,
        preamble: list[DriverItem],
        firsts: list[DriverItem],
        drivers: list[AsyncGenerator[DriverItem, None]],
    ) -> AsyncIterator[bytes]:
        created = int(self.wall_clock())
        writer = ChunkWriter(prepared.kind, request_id, prepared.model, created, logprobs=prepared.logprobs)
        for index in range(prepared.choices):
            opening = writer.opening(index)
            if opening is not None:
                yield data_frame(opening)
        for early in preamble:
            for frame in _frames(writer, 0, early):
                yield frame
        outcomes: list[Outcome] = []
        try:
            # Each route's first item, then all of them as they come; a keep-alive comment
            # whenever none comes for a while (a long prefill or a failover replay).
            chained = _chain(list(enumerate(firsts)), interleave(drivers))
            async with contextlib.aclosing(with_keepalive(chained, self.config.keepalive_seconds)) as items:
                async for entry in items:
                    if entry is None:
                        yield KEEPALIVE
                        continue
                    index, item = entry
                    for frame in _frames(writer, index, item):
                        yield frame
                    if isinstance(item, Outcome):
                        outcomes.append(item)
                        if len(outcomes) == prepared.choices and prepared.include_usage:
                            usage = outcomes[0].usage
                            for other in outcomes[1:]:
                                usage = usage + other.usage
                            yield data_frame(writer.usage(usage))
        except Exception as err:  # typed or not, the client gets an error event, never a hang
            yield data_frame(streamed_error(err, request_id))
        yield DONE


async def _chain(
    firsts: list[tuple[int, DriverItem]], rest: AsyncIterator[tuple[int, DriverItem]]
) -> AsyncIterator[tuple[int, DriverItem]]:
    for first in firsts:
        yield first
    async for item in rest:
        yield item


def _frames(writer: ChunkWriter, index: int, item: DriverItem) -> list[bytes]:
    if isinstance(item, TextDelta):
        return [data_frame(writer.delta(item.text, index, item.logprobs))]
    if isinstance(item, TelemetryEvent):
        return [telemetry_comment(item)]
    return [data_frame(writer.closing(item, index))]


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


async def _collect_all(drivers: list[AsyncGenerator[DriverItem, None]], logprobs: bool) -> list[Collected]:
    """Every choice to its end; one failing (or the caller cancelled) stops the others, so no
    driver is still running when ``close`` shuts them."""
    tasks = [asyncio.create_task(_collect(driver, logprobs)) for driver in drivers]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _collect(driver: AsyncIterator[DriverItem], logprobs: bool) -> Collected:
    parts: list[str] = []
    entries: list[LogprobEntry] = []
    outcome: Outcome | None = None
    # Run the driver to its end, not just to the Outcome, so the route can finish normally.
    async for item in driver:
        if isinstance(item, TextDelta):
            parts.append(item.text)
            entries.extend(item.logprobs)
        elif isinstance(item, Outcome):
            outcome = item
    if outcome is None:
        raise MeshnetError("the route ended without an outcome")
    return Collected("".join(parts), outcome, tuple(entries) if logprobs else None)


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
