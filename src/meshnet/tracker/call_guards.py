"""What every handler on the tracker's port goes through before its own work: the caller's
admission (``admit_call``), the count of calls in flight and shedding (``counted``,
``admitted``: ``tracker.admission``), and typed errors leaving as their one gRPC status
(``maps_errors``: ``meshnet.wire.status``).

The Tracker, SwarmStatus, Swarm and ArtifactDirectory services share these, so a call is
admitted, counted and mapped the same way whichever service it reaches.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from meshnet.core.errors import MeshnetError
from meshnet.security.identity import PeerIdentity
from meshnet.security.policy import authorize_tracker
from meshnet.tracker.admission import CallClass
from meshnet.wire.status import abort_with
from meshnet.wire.tls import LinkSecurity, enforce

Request = TypeVar("Request")
Reply = TypeVar("Reply")
Handler = Callable[[Any, Request, grpc.aio.ServicerContext], Awaitable[Reply]]


def maps_errors(handler: Handler[Request, Reply]) -> Handler[Request, Reply]:
    """Turn a typed error raised by ``handler`` into its one gRPC status (protocol.status)."""

    @functools.wraps(handler)
    async def guarded(self: Any, request: Request, context: grpc.aio.ServicerContext) -> Reply:
        try:
            return await handler(self, request, context)
        except MeshnetError as error:
            await abort_with(context, error)

    return guarded


def counted(handler: Handler[Request, Reply]) -> Handler[Request, Reply]:
    """Count ``handler`` in flight on the servicer's ``admission``; the handler sheds itself with
    ``admission.check`` once its caller is authenticated (``tracker.admission``). Goes under
    ``maps_errors``."""

    @functools.wraps(handler)
    async def counting(self: Any, request: Request, context: grpc.aio.ServicerContext) -> Reply:
        with self.admission.counting():
            return await handler(self, request, context)

    return counting


def admitted(call: CallClass) -> Callable[[Handler[Request, Reply]], Handler[Request, Reply]]:
    """Serve ``handler`` only if the servicer's ``admission`` does not shed a ``call`` now
    (``tracker.admission``), counting it in flight while it runs: for ``live`` calls (never shed)
    and calls with no caller to authenticate. Goes under ``maps_errors``."""

    def wrap(handler: Handler[Request, Reply]) -> Handler[Request, Reply]:
        @functools.wraps(handler)
        async def counted(self: Any, request: Request, context: grpc.aio.ServicerContext) -> Reply:
            with self.admission.handling(call):
                return await handler(self, request, context)

        return counted

    return wrap


def admit_call(
    security: LinkSecurity | None, context: grpc.aio.ServicerContext, rpc: str, subject: str | None = None
) -> PeerIdentity | None:
    """The caller of a tracker-port ``rpc``, if it is allowed to it; None on a plaintext tracker.

    Every service on the tracker's port (Tracker, SwarmStatus, ArtifactDirectory) asks this."""
    if security is None:
        return None
    peer = security.peer(context)
    enforce(authorize_tracker(peer, rpc, subject_node_id=subject, revoked=security.revocations.current()))
    return peer
