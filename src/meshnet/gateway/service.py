"""Serving one completion request: admission, the route run, and the streaming or whole response.

The endpoints in app.py parse and prepare; this module admits the request (at once, or after
waiting in the admission queue), starts its choices on the route (``choices.RequestRun``) and
shapes what they push into SSE chunks or one OpenAI object. It guarantees that whatever happens
-- success, typed failure, deadline, client disconnect before or during the stream -- every
route session is ended and the admission slots returned exactly once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing
from typing import TypeVar

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from meshnet.core.errors import Cancelled
from meshnet.core.ids import RequestId
from meshnet.gateway.admission import Admission, Lease, Refused
from meshnet.gateway.answer_shape import AnswerShape
from meshnet.gateway.auth import request_caller
from meshnet.gateway.capacity import SwarmCapacity
from meshnet.gateway.choice_view import ChoiceView, ShownItem, TextDelta
from meshnet.gateway.choices import RequestRun, choice_request_id
from meshnet.gateway.config import GatewayConfig
from meshnet.gateway.errors import HttpError, streamed_error
from meshnet.gateway.ports import RouteGenerator, TextCodec
from meshnet.gateway.prepare import ModelLimits, PreparedRequest, model_limits, unknown_model
from meshnet.gateway.responses import ChunkWriter, completion_object, total_usage
from meshnet.gateway.sse import DONE, KEEPALIVE, ManagedStreamingResponse, data_frame, telemetry_comment
from meshnet.gateway.telemetry_hub import TelemetryEvent, TelemetryHub
from meshnet.gateway.tools.shape import ToolStreamShaper, shape_completion
from meshnet.route.life import Failure, Outcome

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

    async def respond(
        self, request: Request, prepared: PreparedRequest, codec: TextCodec, shape: AnswerShape | None = None
    ) -> Response:
        """Serve ``prepared``; ``shape``, when given, shapes the answer instead of the completion objects."""
        request_id: RequestId = request.state.request_id
        await self.capacity.refresh_if_stale()
        lease, preamble = await self.admit(request, request_id, prepared.model)
        leases = [lease]
        try:
            leases += await self._admit_more_choices(request, request_id, prepared.choices - 1)
        except BaseException:
            lease.release()
            raise
        views = [self._view(prepared, codec, request_id, i, lease.waited_s) for i in range(prepared.choices)]
        run = RequestRun(views, streamed=prepared.stream)

        async def close() -> None:
            try:
                await run.close(self.config.cancel_grace_seconds)
            finally:
                for held in leases:
                    held.release()

        handed_off = False
        try:
            run.start(self.generator, prepared, codec)
            if prepared.stream:
                # Wait for each route's first item before sending headers, so a request that
                # finds no route still gets a proper HTTP status instead of a streamed error.
                firsts = await run.first_entries()
                frames = (
                    self._sse(prepared, request_id, preamble, firsts, run)
                    if shape is None
                    else shape.stream(run.entries(preamble, firsts, self.config.keepalive_seconds))
                )
                response = ManagedStreamingResponse(frames, on_close=close)
                handed_off = True
                return response
            if shape is not None:
                return JSONResponse(shape.whole(await _unless_disconnected(request, run.collect(prepared.logprobs))))
            collected = await _unless_disconnected(request, run.collect(prepared.logprobs))
            created = int(self.wall_clock())
            body = completion_object(prepared.kind, request_id, prepared.model, created, collected)
            if prepared.tools is not None and prepared.tools.active:
                body = shape_completion(body, prepared.tools)
            return JSONResponse(body)
        finally:
            if not handed_off:
                with anyio.CancelScope(shield=True):
                    await close()

    def _view(
        self, prepared: PreparedRequest, codec: TextCodec, request_id: RequestId, index: int, queue_seconds: float
    ) -> ChoiceView:
        choice_id = choice_request_id(request_id, index)
        if index > 0:
            self.hub.open(choice_id, prepared.model)
        return ChoiceView(choice_id, codec, self.hub, self.config, self.clock, queue_seconds)

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

    async def admit(self, request: Request, request_id: RequestId, model: str) -> tuple[Lease, list[ShownItem]]:
        """A slot, after waiting in the queue if need be; the ``queued`` event, if it waited.

        A request refused at once gets no telemetry log: under overload those would evict the
        logs of the requests being served.
        """
        preamble: list[ShownItem] = []
        owner = request_caller(request).key_id

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
            if request_id not in self.hub:  # refused at once: logged, but no telemetry log kept
                self.hub.refused(request_id, model, owner, error.code)
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
        preamble: list[ShownItem],
        firsts: list[tuple[int, list[ShownItem]]],
        run: RequestRun,
    ) -> AsyncIterator[bytes]:
        created = int(self.wall_clock())
        writer = ChunkWriter(prepared.kind, request_id, prepared.model, created, logprobs=prepared.logprobs)
        for index in range(prepared.choices):
            opening = writer.opening(index)
            if opening is not None:
                yield data_frame(opening)
        stream = _StreamState(writer, request_id, prepared.choices, prepared.include_usage)
        if prepared.tools is not None and prepared.tools.active:
            stream.tools = ToolStreamShaper(prepared.tools, writer.choice_delta, prepared.choices)
        # The queue wait's events, each choice's first items, then every item as it comes; a
        # keep-alive comment whenever none comes for a while (a long prefill or a failover replay).
        async with aclosing(run.entries(preamble, firsts, self.config.keepalive_seconds)) as entries:
            async for entry in entries:
                if entry is None:
                    yield KEEPALIVE
                    continue
                for frame in stream.frames(*entry):
                    yield frame
                if stream.failed:
                    break  # the error event went out; the other choices are closed by the caller
        yield DONE


class _StreamState:
    """Shapes the shown items of a stream into SSE frames: chunks, telemetry comments, usage,
    and after a failure the error event (the caller then sends ``[DONE]``)."""

    def __init__(self, writer: ChunkWriter, request_id: RequestId, choices: int, include_usage: bool) -> None:
        self.writer = writer
        self.request_id = request_id
        self.include_usage = include_usage
        self.outcomes: dict[int, Outcome] = {}
        self.choices = choices
        self.failed = False
        self.tools: ToolStreamShaper | None = None
        """Set when the replies may call tools: text and endings go through its parser."""

    def frames(self, index: int, shown: list[ShownItem]) -> list[bytes]:
        frames: list[bytes] = []
        for item in shown:
            if self.failed:
                break
            if isinstance(item, TextDelta) and self.tools is not None:
                frames += [data_frame(chunk) for chunk in self.tools.delta(item.text, index)]
            elif isinstance(item, TextDelta):
                frames.append(data_frame(self.writer.delta(item.text, index, item.logprobs)))
            elif isinstance(item, TelemetryEvent):
                frames.append(telemetry_comment(item))
            elif isinstance(item, Failure):
                # Typed or not, the client gets an error event, never a hang.
                self.failed = True
                frames.append(data_frame(streamed_error(item.error, self.request_id)))
            else:
                closing = [self.writer.closing(item, index)] if self.tools is None else self.tools.closing(item, index)
                frames += [data_frame(chunk) for chunk in closing]
                self.outcomes[index] = item
                if len(self.outcomes) == self.choices and self.include_usage:
                    frames.append(data_frame(self.writer.usage(total_usage(self.outcomes.values()))))
        return frames


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
