"""Server-Sent Events framing, and the streaming response that always cleans up after itself.

Telemetry rides in the completion stream as SSE *comment* lines, ``: telemetry {json}``. The
choice is deliberate: the SSE spec says comments are ignored, and the official ``openai`` client
(v3.x) yields every event that has data -- a named ``event: telemetry`` would reach user code as
a malformed chunk -- while it skips comments without looking. A raw parser reads them by taking
lines that start with ``: telemetry ``. The separate ``/v1/telemetry/{id}/events`` stream is not
for OpenAI clients, so there each event is a proper ``event: telemetry`` with ``data`` and ``id``.
The main stream never sends ``id:`` lines: the openai decoder keeps the last id forever and
would then turn every later comment block into an empty event.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from meshnet.gateway.telemetry_hub import TelemetryEvent

MEDIA_TYPE = "text/event-stream"
DONE = b"data: [DONE]\n\n"
TELEMETRY_PREFIX = ": telemetry "
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _json(payload: Any) -> str:
    # json.dumps escapes newlines inside strings, so one payload is always one SSE line.
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


KEEPALIVE = b": keep-alive\n\n"
"""Sent while a stream has nothing else to say, so proxies and clients see it is alive."""


def data_frame(payload: Any) -> bytes:
    return f"data: {_json(payload)}\n\n".encode()


def telemetry_comment(event: TelemetryEvent) -> bytes:
    return f"{TELEMETRY_PREFIX}{_json(event.as_json())}\n\n".encode()


def telemetry_event_frame(event: TelemetryEvent) -> bytes:
    return f"event: telemetry\nid: {event.seq}\ndata: {_json(event.as_json())}\n\n".encode()


class ManagedStreamingResponse(StreamingResponse):
    """A streaming response that runs ``on_close`` however the stream ends.

    Starlette cancels the body when the client disconnects, and may never start the body at
    all if the client left before the headers went out; an admission slot or route session
    released only inside the body iterator would then leak. ``on_close`` runs shielded.
    """

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        on_close: Callable[[], Awaitable[None]],
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(content, media_type=MEDIA_TYPE, headers={**HEADERS, **(headers or {})})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._on_close()
