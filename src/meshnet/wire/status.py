"""The one mapping between meshnet's typed errors and gRPC status codes, both ways.

A servicer aborts with the status of the reliability design's status contract and carries the
error's machine-readable ``code`` and ``retryable`` in trailing metadata; a caller rebuilds the
same typed error from a ``grpc.RpcError``. gRPC's own DEADLINE_EXCEEDED / UNAVAILABLE / CANCELLED
(raised by the library, so without our metadata) become DeadlineExceeded / Unavailable / Cancelled.

Storage failures are typed too (the tracker's store turns SQLite's errors into them): a disk
that is full, failing or locked is UNAVAILABLE with code ``storage_unavailable`` (retry: nothing
was stored), a database that fails its integrity check DATA_LOSS with code ``storage_damaged``.
Neither is a refusal of what the caller sent, so a caller keeps it and tries again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn

import grpc
import grpc.aio

from meshnet.core.errors import (
    CacheMiss,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    IntegrityError,
    InvalidArgument,
    MeshnetError,
    PermissionDenied,
    ResourceExhausted,
    StorageDamaged,
    StorageUnavailable,
    TrackerBusy,
    Unauthenticated,
    Unavailable,
)

ERROR_CODE_KEY = "meshnet-error-code"
RETRYABLE_KEY = "meshnet-retryable"
RETRY_AFTER_KEY = "meshnet-retry-after-ms"
"""How long a shedding peer asks the caller to wait (``TrackerBusy.retry_after_s``), in ms."""

# Order matters only between a class and its subclasses; these bases are disjoint, and
# ArtifactError, RouteStale and NoRoute follow their bases. The storage errors are listed for
# the reader (their bases map them the same way); they come first so the reverse map below
# keeps the bases for a bare status.
_STATUS_BY_TYPE: tuple[tuple[type[MeshnetError], grpc.StatusCode], ...] = (
    (StorageUnavailable, grpc.StatusCode.UNAVAILABLE),
    (StorageDamaged, grpc.StatusCode.DATA_LOSS),
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (IntegrityError, grpc.StatusCode.DATA_LOSS),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (CacheMiss, grpc.StatusCode.NOT_FOUND),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
    (Cancelled, grpc.StatusCode.CANCELLED),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
)
# Without our metadata (the library itself, a proxy, a peer of another version) the status alone
# decides; the library's RESOURCE_EXHAUSTED is a message over the size limit, which fits too.
_TYPE_BY_STATUS: dict[grpc.StatusCode, type[MeshnetError]] = {
    status: error_type for error_type, status in _STATUS_BY_TYPE
}


def status_for(error: MeshnetError) -> grpc.StatusCode:
    """The gRPC status a servicer answers ``error`` with; INTERNAL for anything unmapped."""
    for error_type, status in _STATUS_BY_TYPE:
        if isinstance(error, error_type):
            return status
    return grpc.StatusCode.INTERNAL


def error_metadata(error: MeshnetError) -> tuple[tuple[str, str], ...]:
    """Trailing metadata that lets any client recover the precise error, not just the status."""
    metadata: tuple[tuple[str, str], ...] = (
        (ERROR_CODE_KEY, error.code),
        (RETRYABLE_KEY, "true" if error.retryable else "false"),
    )
    if isinstance(error, TrackerBusy):
        metadata += ((RETRY_AFTER_KEY, str(max(0, round(error.retry_after_s * 1000)))),)
    return metadata


async def abort_with(context: grpc.aio.ServicerContext, error: MeshnetError) -> NoReturn:
    """End the RPC with ``error``'s status, message and metadata (for async servicers)."""
    await context.abort(status_for(error), error.message, trailing_metadata=error_metadata(error))
    # context.abort always raises; re-raising keeps the NoReturn promise for any stand-in context.
    raise error


def error_from_rpc(err: grpc.RpcError, *, unreachable: type[Unavailable] = Unavailable) -> MeshnetError:
    """Rebuild the typed error a peer (or the gRPC library) ended a call with.

    ``unreachable`` is the error of an UNAVAILABLE the library raised itself (the peer could not
    be reached): a lost worker for shard calls, ``Unreachable`` for control-plane services
    (the tracker), where nothing was lost.

    A CANCELLED without our metadata is the peer's doing, never the caller's: grpc.aio raises
    ``asyncio.CancelledError``, not an RpcError, on a call its own side cancelled. A peer's
    server cancels its calls when it stops (its grace over) or its process is ending, so the
    caller lost that peer (``unreachable``); only a peer's deliberate ``Cancelled`` (with our
    metadata) stays a cancellation.
    """
    status = _call(err, "code")
    details = _call(err, "details") or ""
    code = _metadata_value(_call(err, "trailing_metadata"), ERROR_CODE_KEY)
    error_type = _type_for_code(code) if code else None
    if error_type is None and status in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        error_type = unreachable
    if error_type is None:
        error_type = _TYPE_BY_STATUS.get(status, MeshnetError) if status else MeshnetError
    message = details or f"the peer ended the call with {getattr(status, 'name', 'no status')}"
    if error_type is TrackerBusy:
        return TrackerBusy(message, _retry_after_s(_call(err, "trailing_metadata")))
    try:
        return error_type(message)
    except TypeError:
        # A subclass with a richer constructor: keep the category rather than fail here.
        fallback = _TYPE_BY_STATUS.get(status, MeshnetError) if status else MeshnetError
        return fallback(message)


def error_for_code(code: str, message: str) -> MeshnetError:
    """The typed error a peer reported in-band by its ``code`` (``RingEnd``): the generic one for
    a code this version does not know."""
    error_type = _type_for_code(code) or MeshnetError
    try:
        return error_type(message)
    except TypeError:  # a subclass with a richer constructor: keep the message
        return MeshnetError(message)


def status_and_code(err: grpc.RpcError) -> tuple[grpc.StatusCode | None, str | None]:
    """How ``err`` ended: its status, and the peer's ``meshnet-error-code`` (None when the library
    ended the call itself: refused, reset, stopped, out of time)."""
    return _call(err, "code"), _metadata_value(_call(err, "trailing_metadata"), ERROR_CODE_KEY)


def _call(err: grpc.RpcError, method: str) -> Any:
    # A bare grpc.RpcError has none of these; grpc.Call / AioRpcError have all of them.
    accessor = getattr(err, method, None)
    return accessor() if callable(accessor) else None


def _metadata_value(metadata: Iterable[Any] | None, key: str) -> str | None:
    for item in metadata or ():
        if item[0] == key:
            value = item[1]
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return None


def _retry_after_s(metadata: Iterable[Any] | None) -> float:
    """The peer's retry hint in seconds; 1 s when absent or malformed (a hostile peer's huge
    hint is capped at a minute: it may slow a caller, never park it)."""
    raw = _metadata_value(metadata, RETRY_AFTER_KEY)
    try:
        millis = int(raw) if raw is not None else 1000
    except ValueError:
        millis = 1000
    return min(max(millis, 0), 60_000) / 1000.0


def _type_for_code(code: str) -> type[MeshnetError] | None:
    """The error class whose ``code`` is ``code``, nearest the root first (breadth-first)."""
    pending: list[type[MeshnetError]] = [MeshnetError]
    while pending:
        error_type = pending.pop(0)
        if error_type.code == code:
            return error_type
        pending.extend(error_type.__subclasses__())
    return None
