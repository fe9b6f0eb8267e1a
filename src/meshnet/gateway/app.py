"""The OpenAI-compatible HTTP app: routes, body parsing, request ids, telemetry endpoints.

``create_app`` builds everything a gateway holds -- telemetry hub, admission queue, service --
so two apps in one process share nothing. Endpoints stay thin: read a bounded body, validate it
strictly, prepare it for the model, and hand it to the ``CompletionService``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.responses import StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from meshnet.core.ids import RequestId, new_request_id
from meshnet.gateway.admission import Admission
from meshnet.gateway.auth import KeyVerifier, api_key_dependency, may_read, request_caller
from meshnet.gateway.capacity import SwarmCapacity
from meshnet.gateway.config import GatewayConfig, admission_limits
from meshnet.gateway.embeddings.body import EmbeddingsBody
from meshnet.gateway.embeddings.serve import serve_embeddings
from meshnet.gateway.errors import (
    HttpError,
    error_response,
    install_error_handlers,
    internal_error,
    validation_error,
)
from meshnet.gateway.grammars import GrammarBuilder
from meshnet.gateway.openai_options import build_schema_constraint
from meshnet.gateway.ports import ModelCard, RouteGenerator, SwarmView, TextCodec
from meshnet.gateway.prepare import ModelLimits, PreparedRequest, prepare_chat, prepare_text
from meshnet.gateway.request_ledger import RequestLedger
from meshnet.gateway.responses_api.body import ResponsesBody, chat_body, check_supported
from meshnet.gateway.responses_api.shape import ResponsesShape, response_header
from meshnet.gateway.schemas import ChatCompletionBody, CompletionBody
from meshnet.gateway.service import CompletionService
from meshnet.gateway.sse import HEADERS, MEDIA_TYPE, telemetry_event_frame
from meshnet.gateway.status.page import SwarmStatus, status_router
from meshnet.gateway.telemetry_hub import TelemetryHub
from meshnet.gateway.tools.grammar import build_tool_constraint
from meshnet.gateway.tools.plan import ToolPlan, read_tool_plan
from meshnet.telemetry.history import HistoryShape
from meshnet.telemetry.prometheus import CONTENT_TYPE, build_registry, render

logger = logging.getLogger(__name__)
BodyT = TypeVar("BodyT", bound=BaseModel)


class RequestIdMiddleware:
    """Give every HTTP request a fresh id (``request.state.request_id``) and echo it as a header.

    A plain ASGI middleware rather than ``BaseHTTPMiddleware``, which would buffer streams and
    break disconnect detection. Client-supplied ids are ignored: the id keys the telemetry
    endpoints, so it must be unguessable and unique.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id

        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            logger.exception("unhandled error serving %s", request_id)
            if started:
                raise  # mid-response: nothing valid can be sent any more
            await error_response(internal_error())(scope, receive, send_with_id)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes before buffering them."""
    too_large = HttpError(413, "request_too_large", f"the request body exceeds {limit} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def parse_body(model: type[BodyT], raw: bytes) -> BodyT:
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as err:
        raise validation_error(err) from None


def new_admission(
    config: GatewayConfig, *, clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None
) -> Admission:
    """The gateway's slots and queue at ``config``'s limits (resized later from the swarm's size)."""
    in_flight, queue = admission_limits(config, None)
    return Admission(
        in_flight, queue, clock=clock, rng=rng or random.Random(), retry_after_floor=config.retry_after_seconds
    )


def create_app(
    generator: RouteGenerator,
    codecs: Mapping[str, TextCodec],
    config: GatewayConfig,
    *,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    rng: random.Random | None = None,
    api_keys: KeyVerifier | None = None,
    extra_figures: Callable[[], Mapping[str, float]] | None = None,
    view: SwarmView | None = None,
    admission: Admission | None = None,
) -> FastAPI:
    """Build the gateway app over a route generator and one text codec per model id.

    ``rng`` draws the jitter of overload Retry-After values (seed it for repeatable tests).
    ``api_keys`` checks the Bearer key of every ``/v1`` request; None serves them anonymously.
    ``extra_figures`` adds counters of the parts around the app (the audit) to ``/metrics``.
    ``view`` is the swarm the status page, ``/health`` and ``/v1/models`` describe (the tracker's
    node table); without it they describe only the gateway.
    ``admission`` is the gateway's slots and queue when parts around the app share them (the
    audit's replays); by default the app makes its own from ``config``.
    """
    admission = admission or new_admission(config, clock=clock, rng=rng)
    ledger = _new_ledger(config, admission, clock)
    hub = TelemetryHub(
        max_requests=config.telemetry_max_requests,
        max_events_per_request=config.telemetry_max_events_per_request,
        clock=clock,
        ledger=ledger,
    )
    capacity = SwarmCapacity(generator, admission, config, clock)
    service = CompletionService(
        generator,
        codecs,
        config,
        hub=hub,
        admission=admission,
        capacity=capacity,
        clock=clock,
        wall_clock=wall_clock,
    )
    app = FastAPI(title="meshnet gateway", version="1", docs_url=None, redoc_url=None)
    app.state.hub = hub
    app.state.admission = admission
    install_error_handlers(app, retry_after_seconds=config.retry_after_seconds)
    app.add_middleware(RequestIdMiddleware)
    status = SwarmStatus(
        view, next(iter(codecs), ""), hub, admission, cache_seconds=config.status_interval_seconds, clock=clock
    )
    app.state.status = status
    guard = [Depends(api_key_dependency(api_keys))]
    _add_status_routes(app, admission, hub, status, extra_figures or dict, ledger)
    app.include_router(status_router(status, interval_seconds=config.status_interval_seconds, guard=guard))
    _add_completion_routes(app, service, generator, codecs, status, guard)
    _add_telemetry_routes(app, hub, guard)
    return app


def _new_ledger(config: GatewayConfig, admission: Admission, clock: Callable[[], float]) -> RequestLedger:
    """The request ledger (log line, histograms, history), sampling ``admission``'s gauges."""
    shape = HistoryShape(config.history_bucket_seconds, config.history_buckets)
    return RequestLedger(shape, clock, lambda: {"queued": admission.queued, "in_flight": admission.in_flight})


def _add_status_routes(
    app: FastAPI,
    admission: Admission,
    hub: TelemetryHub,
    status: SwarmStatus,
    extra_figures: Callable[[], Mapping[str, float]],
    ledger: RequestLedger,
) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        # 503 only when no complete route exists: a degraded swarm still serves.
        verdict = await status.health()
        body = {
            **verdict.as_json(),
            "model": status.model,
            "in_flight": admission.in_flight,
            "capacity": admission.capacity,
            "queued": admission.queued,
            "queue_limit": admission.queue_limit,
        }
        return JSONResponse(body, status_code=503 if verdict.status == "no_route" else 200)

    def figures() -> dict[str, float]:
        return {
            "in_flight": float(admission.in_flight),
            "capacity": float(admission.capacity),
            "queued": float(admission.queued),
            "queue_limit": float(admission.queue_limit),
            "admitted_total": float(admission.admitted),
            "rejected_total": float(admission.rejected),
            "queue_timeouts_total": float(admission.timed_out),
            "queued_requests_total": float(admission.queued_total),
            "queue_wait_seconds_total": admission.waited_seconds_total,
            **hub.totals,
            **extra_figures(),
        }

    metrics_registry = build_registry("meshnet_gateway", figures, histograms=ledger.histograms)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render(metrics_registry), media_type=CONTENT_TYPE)


def _add_model_routes(
    app: FastAPI,
    generator: RouteGenerator,
    codecs: Mapping[str, TextCodec],
    status: SwarmStatus,
    guard: list[Any],
) -> None:
    async def cards() -> list[dict[str, Any]]:
        # The context a session really gets: the smaller of the model's and the current route's.
        # Without a route nobody can say; the model's own limit is shown, marked not routable.
        route_context = await status.route_context()
        served = [card for card in generator.models() if card.id in codecs]
        if route_context is not None:
            served = [replace(card, context_length=min(card.context_length, route_context)) for card in served]
        routable = {} if not status.has_view else {"routable": route_context is not None}
        return [{**_model_object(card), **routable} for card in served]

    @app.get("/v1/models", dependencies=guard)
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": await cards()}

    @app.get("/v1/models/{model_id:path}", dependencies=guard)
    async def get_model(model_id: str) -> dict[str, Any]:
        card = next((card for card in await cards() if card["id"] == model_id), None)
        if card is None:
            known = ", ".join(repr(c.id) for c in generator.models() if c.id in codecs)
            raise HttpError(404, "model_not_found", f"no model {model_id!r} here; this gateway serves {known}")
        return card


async def _prepared_chat(
    body: ChatCompletionBody, codec: TextCodec, limits: ModelLimits, config: GatewayConfig, grammars: GrammarBuilder
) -> tuple[PreparedRequest, ToolPlan | None]:
    """A chat's tool plan, its grammar (the tools', else ``response_format``'s) and the prepared
    request: the one path of ``/v1/chat/completions`` and ``/v1/responses``."""
    tools = read_tool_plan(body, codec.chat_template_source)
    grammar = await build_tool_constraint(tools, grammars) or await build_schema_constraint(body, grammars)
    return prepare_chat(body, codec, limits, config, grammar, tools), tools


def _add_completion_routes(
    app: FastAPI,
    service: CompletionService,
    generator: RouteGenerator,
    codecs: Mapping[str, TextCodec],
    status: SwarmStatus,
    guard: list[Any],
) -> None:
    config = service.config
    grammars = GrammarBuilder(config.grammar_timeout_seconds)
    app.state.grammars = grammars
    _add_model_routes(app, generator, codecs, status, guard)

    async def resolve(model: str) -> tuple[TextCodec, ModelLimits]:
        # A prompt is held to the context /v1/models shows: the route's when there is one.
        codec, limits = service.resolve(model)
        route_context = await status.route_context() if model == status.model else None
        if route_context is not None and route_context < limits.context_length:
            limits = replace(limits, context_length=route_context)
        return codec, limits

    @app.post("/v1/chat/completions", dependencies=guard)
    async def chat_completions(request: Request) -> Response:
        body = parse_body(ChatCompletionBody, await read_body(request, config.max_body_bytes))
        codec, limits = await resolve(body.model)
        prepared, _ = await _prepared_chat(body, codec, limits, config, grammars)
        return await service.respond(request, prepared, codec)

    @app.post("/v1/completions", dependencies=guard)
    async def completions(request: Request) -> Response:
        body = parse_body(CompletionBody, await read_body(request, config.max_body_bytes))
        codec, limits = await resolve(body.model)
        prepared = prepare_text(body, codec, limits, config, await build_schema_constraint(body, grammars))
        return await service.respond(request, prepared, codec)

    @app.post("/v1/embeddings", dependencies=guard)
    async def embeddings(request: Request) -> Response:
        body = parse_body(EmbeddingsBody, await read_body(request, config.max_body_bytes))
        codec, limits = await resolve(body.model)
        return JSONResponse(await serve_embeddings(service, request, body, codec, limits.context_length))

    @app.post("/v1/responses", dependencies=guard)
    async def responses(request: Request) -> Response:
        body = parse_body(ResponsesBody, await read_body(request, config.max_body_bytes))
        check_supported(body)
        codec, limits = await resolve(body.model)
        prepared, tools = await _prepared_chat(chat_body(body), codec, limits, config, grammars)
        header = response_header(body, request.state.request_id, int(service.wall_clock()))
        return await service.respond(request, prepared, codec, ResponsesShape(header, tools))


def _model_object(card: ModelCard) -> dict[str, Any]:
    return {
        "id": card.id,
        "object": "model",
        "created": 0,
        "owned_by": card.owned_by,
        "quantization": card.quantization,
        "context_length": card.context_length,
        **({"adapter": card.adapter} if card.adapter else {}),
    }


def _add_telemetry_routes(app: FastAPI, hub: TelemetryHub, guard: list[Any]) -> None:
    def readable(request: Request, request_id: str) -> RequestId:
        # Another key's request is answered exactly like an unknown one: ids must not leak.
        wanted = RequestId(request_id)
        if wanted not in hub or not may_read(hub.owner(wanted), request_caller(request)):
            raise _telemetry_not_found(request_id)
        return wanted

    @app.get("/v1/telemetry/{request_id}", dependencies=guard)
    async def telemetry_snapshot(request: Request, request_id: str) -> JSONResponse:
        snapshot = hub.snapshot(readable(request, request_id))
        if snapshot is None:
            raise _telemetry_not_found(request_id)
        return JSONResponse(snapshot.as_json())

    @app.get("/v1/telemetry/{request_id}/events", dependencies=guard)
    async def telemetry_events(request: Request, request_id: str) -> StreamingResponse:
        readable(request, request_id)

        async def frames() -> AsyncIterator[bytes]:
            async for event in hub.follow(RequestId(request_id)):
                yield telemetry_event_frame(event)

        return StreamingResponse(frames(), media_type=MEDIA_TYPE, headers=HEADERS)


def _telemetry_not_found(request_id: str) -> HttpError:
    return HttpError(
        404,
        "telemetry_not_found",
        f"no telemetry is kept for request {request_id!r} (unknown, or evicted as old)",
        param="request_id",
    )
