"""The operator's view: the status page at ``/`` and ``/status``, ``/v1/status`` and its SSE stream,
and the facts ``/health`` and ``/v1/models`` report (route health, the context a session gets).

Everything here lives on one ``APIRouter`` (``status_router``), so whoever mounts it can put it
behind the gateway's auth. The page is four static files in the package (no CDN, no build);
it reads an API key once from ``/?key=...`` or from its own key form (shown when the gateway
answers 401), keeps it in ``sessionStorage`` and sends it as a Bearer header to this gateway
only, and the URL is rewritten so the key stays out of history. The stream sends one
document per ``status_interval_seconds`` at most, however many requests run, and asks the
tracker at most once per interval however many pages watch (``SwarmStatus`` caches).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.responses import StreamingResponse

from meshnet.core.errors import MeshnetError
from meshnet.core.swarm_status import NodeTable, SwarmHealth, judge_health
from meshnet.gateway.admission import Admission
from meshnet.gateway.auth import OPERATOR, Caller, may_read, request_caller
from meshnet.gateway.ports import SwarmView
from meshnet.gateway.sse import HEADERS, MEDIA_TYPE, data_frame
from meshnet.gateway.status.view import NodeMemory, StatusInputs, status_document
from meshnet.gateway.telemetry_hub import TelemetryHub

logger = logging.getLogger(__name__)

STATIC_FILES = {"status.js": "text/javascript", "charts.js": "text/javascript", "status.css": "text/css"}
MAX_REQUESTS_SHOWN = 50


@dataclass(frozen=True)
class _Cached:
    at: float
    table: NodeTable | None
    error: str


class SwarmStatus:
    """The gateway's view of the swarm, asked of the tracker at most once per ``cache_seconds``."""

    def __init__(
        self,
        view: SwarmView | None,
        model: str,
        hub: TelemetryHub,
        admission: Admission,
        *,
        cache_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self._view = view
        self._hub = hub
        self._admission = admission
        self._cache_seconds = cache_seconds
        self._clock = clock
        self._memory = NodeMemory()
        self._cached: _Cached | None = None
        self._lock = asyncio.Lock()
        self._context: tuple[float, int | None] | None = None

    @property
    def has_view(self) -> bool:
        return self._view is not None

    async def table(self) -> tuple[NodeTable | None, str]:
        async with self._lock:  # one tracker call serves every waiter of this interval
            now = self._clock()
            if self._cached is None or now - self._cached.at >= self._cache_seconds:
                try:
                    table, error = (await self._view.node_table() if self._view else None), ""
                except MeshnetError as failure:
                    table, error = None, failure.message
                self._cached = _Cached(now, table, error)
            return self._cached.table, self._cached.error

    async def health(self) -> SwarmHealth:
        if self._view is None:
            return SwarmHealth("ok", "no tracker behind this gateway (an in-process route)")
        table, error = await self.table()
        return judge_health(self.model, table, error)

    async def route_context(self) -> int | None:
        """The context one session holds on the current route, cached like the node table."""
        if self._view is None:
            return None
        now = self._clock()
        if self._context is None or now - self._context[0] >= self._cache_seconds:
            try:
                value = await self._view.route_context(self.model)
            except MeshnetError as failure:
                logger.info("route context unknown: %s", failure.message)
                value = None
            self._context = (now, value)
        return self._context[1]

    def admission_figures(self) -> dict[str, float]:
        admission = self._admission
        return {
            "in_flight": admission.in_flight,
            "capacity": admission.capacity,
            "queued": admission.queued,
            "queue_limit": admission.queue_limit,
            "admitted_total": admission.admitted,
            "rejected_total": admission.rejected,
        }

    def history(self) -> dict[str, Any]:
        """The live history (the charts' data)."""
        ledger = self._hub.ledger
        return {"series": {}} if ledger is None else ledger.history_json()

    async def document(self, caller: Caller = OPERATOR) -> dict[str, Any]:
        """The status document as ``caller`` may see it: the swarm's nodes and load, but only its
        own requests, errors and billing unless it is an admin."""
        table, error = await self.table()
        now = self._clock()
        ledger = self._hub.ledger
        if ledger is not None:
            ledger.sample_gateway()
        lost = self._memory.update(table, now) if table is not None else ()
        inputs = StatusInputs(
            model=self.model,
            table=table,
            tracker_error=error,
            lost=lost,
            health=await self.health(),
            requests=self._hub.recent(MAX_REQUESTS_SHOWN, lambda owner: may_read(owner, caller)),
            admission=self.admission_figures(),
            totals=dict(self._hub.totals) if caller.admin else self._hub.totals_of(caller.key_id),
            now=now,
            live={} if ledger is None else ledger.latest_rates(),
        )
        return status_document(inputs)


def _static(name: str) -> str:
    return resources.files("meshnet.gateway.status").joinpath("static", name).read_text(encoding="utf-8")


def status_router(status: SwarmStatus, *, interval_seconds: float, guard: Sequence[Any] = ()) -> APIRouter:
    """``/``, ``/status``, ``/status/{file}``, ``/v1/status``, ``/v1/status/history`` (the
    charts' data) and ``/v1/status/stream``.

    The page files hold no data and stay open; ``guard`` (the API-key check) protects the two
    data routes."""
    router = APIRouter()
    page = _static("status.html")
    assets = {name: (_static(name), media) for name, media in STATIC_FILES.items()}

    @router.get("/", include_in_schema=False)
    @router.get("/status", include_in_schema=False)
    async def status_page() -> HTMLResponse:
        return HTMLResponse(page, headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})

    @router.get("/status/{name}", include_in_schema=False)
    async def status_asset(name: str) -> Response:
        if name not in assets:
            return JSONResponse({"error": {"code": "not_found", "message": f"no status file {name!r}"}}, 404)
        text, media = assets[name]
        return Response(text, media_type=media)

    @router.get("/v1/status", dependencies=list(guard))
    async def status_json(request: Request) -> JSONResponse:
        return JSONResponse(await status.document(request_caller(request)))

    @router.get("/v1/status/history", dependencies=list(guard))
    async def status_history() -> JSONResponse:
        return JSONResponse(status.history())

    @router.get("/v1/status/stream", dependencies=list(guard))
    async def status_stream(request: Request) -> StreamingResponse:
        caller = request_caller(request)

        async def frames() -> AsyncIterator[bytes]:
            while True:
                yield data_frame(await status.document(caller))
                await asyncio.sleep(interval_seconds)

        return StreamingResponse(frames(), media_type=MEDIA_TYPE, headers=HEADERS)

    return router
