"""OpenAI-style errors: the one place that maps failures to HTTP statuses and SSE error events.

Before the first byte a failure becomes an HTTP status with ``{"error": {message, type, code,
param}}``; after the stream started it becomes ``data: {"error": {code, message, retryable,
request_id}}`` followed by ``[DONE]`` (see sse.py). Bad input is always a 4xx: FastAPI's 422
and Starlette's plain-text errors are replaced so clients see one error shape.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from meshnet.core.errors import (
    Cancelled,
    CertificationFailed,
    DeadlineExceeded,
    EngineError,
    FailedPrecondition,
    IntegrityError,
    InvalidArgument,
    MeshnetError,
    ResourceExhausted,
    TrackerBusy,
    Unavailable,
)

CLIENT_CLOSED_REQUEST = 499
"""nginx's status for a client that went away; logged, never seen by the client."""


class HttpError(Exception):
    """A failure already decided at the HTTP level: status, OpenAI error fields, Retry-After."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        param: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.retry_after = retry_after

    @property
    def error_type(self) -> str:
        if self.status == 404:
            return "not_found_error"
        if self.status < 500:
            return "invalid_request_error"
        return "server_error"

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "code": self.code,
                "param": self.param,
            }
        }


def bad_request(code: str, message: str, param: str | None = None) -> HttpError:
    return HttpError(400, code, message, param=param)


def http_status_for(error: MeshnetError) -> int:
    """The status-contract column 'gateway, before first byte' for one typed error."""
    # Order matters: subclasses are listed before the classes they refine.
    if isinstance(error, InvalidArgument):
        return 400
    if isinstance(error, IntegrityError | EngineError):
        return 502  # an upstream shard failed or sent damaged bytes: a bad gateway, not bad input
    if isinstance(error, DeadlineExceeded):
        return 504
    if isinstance(error, Cancelled):
        return CLIENT_CLOSED_REQUEST
    # NoRoute, worker lost, stale route after refresh, overload: the client may try again later.
    if isinstance(error, ResourceExhausted | Unavailable | FailedPrecondition):
        return 503
    if isinstance(error, CertificationFailed):
        return 503
    if error.retryable:
        return 503  # e.g. CacheMiss: the state is gone, a fresh request can succeed
    return 500


def http_error_for(error: MeshnetError, retry_after_seconds: int) -> HttpError:
    status = http_status_for(error)
    retry_after = retry_after_seconds if status == 503 else None
    if isinstance(error, TrackerBusy):  # the tracker shed the route: its own hint, whole seconds
        retry_after = max(1, math.ceil(error.retry_after_s))
    return HttpError(status, error.code, error.message, retry_after=retry_after)


def streamed_error(error: BaseException, request_id: str) -> dict[str, Any]:
    """The SSE error payload sent once the stream has started (then ``[DONE]``)."""
    if isinstance(error, MeshnetError):
        code, message, retryable = error.code, error.message, error.retryable
    else:
        code, message, retryable = "internal", "internal gateway error", False
    return {
        "error": {
            "code": code,
            "message": message,
            "retryable": retryable,
            "request_id": request_id,
        }
    }


def validation_error(error: ValidationError | RequestValidationError) -> HttpError:
    """Turn pydantic's report into one OpenAI-style 400 naming the first offending field."""
    details = error.errors()
    if not details:
        return bad_request("invalid_request", "the request body is invalid")
    first = details[0]
    kind = str(first.get("type", ""))
    if kind == "json_invalid":
        return bad_request("invalid_json", "the request body is not valid JSON")
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(location) or None
    code = "missing_required_parameter" if kind == "missing" else "invalid_parameter"
    where = f"{param}: " if param else ""
    return bad_request(code, f"{where}{first.get('msg', 'invalid value')}", param)


def error_response(error: HttpError) -> JSONResponse:
    headers = {} if error.retry_after is None else {"Retry-After": str(error.retry_after)}
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def internal_error() -> HttpError:
    return HttpError(500, "internal", "internal gateway error")


def install_error_handlers(app: FastAPI, *, retry_after_seconds: int) -> None:
    """Make every expected failure leave the app as an OpenAI-style error object.

    Unexpected exceptions are turned into a 500 by ``RequestIdMiddleware`` (app.py), which
    sits inside Starlette's outermost error middleware and so can still add the request id.
    """

    async def on_http_error(_: Request, exc: Exception) -> JSONResponse:
        if not isinstance(exc, HttpError):
            raise exc
        return error_response(exc)

    async def on_meshnet_error(_: Request, exc: Exception) -> JSONResponse:
        if not isinstance(exc, MeshnetError):
            raise exc
        return error_response(http_error_for(exc, retry_after_seconds))

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        if not isinstance(exc, RequestValidationError | ValidationError):
            raise exc
        return error_response(validation_error(exc))

    async def on_starlette(_: Request, exc: Exception) -> JSONResponse:
        if not isinstance(exc, StarletteHTTPException):
            raise exc
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(HttpError(exc.status_code, code, str(exc.detail)))

    app.add_exception_handler(HttpError, on_http_error)
    app.add_exception_handler(MeshnetError, on_meshnet_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(ValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_starlette)
