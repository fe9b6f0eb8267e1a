"""API-key authentication of the gateway's ``/v1`` routes, and who may read which telemetry.

Every ``/v1/*`` route depends on ``require_api_key``: a missing, malformed, unknown or revoked
key is an OpenAI-style 401 before the body is read. The verdicts are pure functions
(``bearer_token``, ``may_read``) so they are tested without HTTP. The key itself is never
logged or kept: only the name of the key it matched is, as the request's owner.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from fastapi import Request

from meshnet.gateway.errors import HttpError

ANONYMOUS = None
"""The owner of requests served without keys (``--allow-anonymous``): everyone may read them."""


class KeyVerifier(Protocol):
    """Names the active key a presented secret belongs to (``keys.ApiKeyStore``)."""

    def verify(self, key: str) -> str | None: ...


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header; None when absent or malformed."""
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


def may_read(owner: str | None, caller: str | None) -> bool:
    """Whether ``caller`` may read telemetry of a request made with key ``owner``.

    Only the key that made a request reads it; a request made without keys is readable by all.
    Refusals are answered as 404 (not 403) by the caller, so foreign request ids do not leak.
    """
    return owner is ANONYMOUS or owner == caller


def invalid_api_key(message: str) -> HttpError:
    return HttpError(401, "invalid_api_key", message)


def api_key_dependency(verifier: KeyVerifier | None) -> Callable[[Request], Awaitable[None]]:
    """A FastAPI dependency that sets ``request.state.api_key_name`` or raises a 401.

    With no verifier (``--allow-anonymous``) every request passes as anonymous.
    """

    async def require_api_key(request: Request) -> None:
        if verifier is None:
            request.state.api_key_name = ANONYMOUS
            return
        token = bearer_token(request.headers.get("authorization"))
        if token is None:
            raise invalid_api_key(
                "missing API key: send 'Authorization: Bearer YOUR_KEY' "
                "(create one with `meshnet swarm api-key create NAME`)"
            )
        name = verifier.verify(token)
        if name is None:
            raise invalid_api_key("incorrect API key provided")
        request.state.api_key_name = name

    return require_api_key
