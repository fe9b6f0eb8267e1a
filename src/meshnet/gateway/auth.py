"""API-key authentication of the gateway's ``/v1`` routes, and who may read which requests.

Every ``/v1/*`` route depends on ``require_api_key``: a missing, malformed, unknown or revoked
key is an OpenAI-style 401 before the body is read. The verdicts are pure functions
(``bearer_token``, ``may_read``) so they are tested without HTTP. The key itself is never
logged or kept: only the id of the key it matched is, as the request's owner (``Caller``).

Requests, their telemetry and the status page's rows belong to the key id that made them. A key
reads only its own; an admin key (``meshnet swarm api-key create --admin``, or the operator's
``DATA_DIR/api-key``) reads all. Without keys (``--allow-anonymous``, loopback only) every caller
is the operator and reads everything.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from fastapi import Request

from meshnet.gateway.errors import HttpError
from meshnet.gateway.keys import KeyIdentity

ANONYMOUS = None
"""The owner of requests served without keys (``--allow-anonymous``)."""


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the id of its key (None without keys) and whether it reads all."""

    key_id: str | None
    admin: bool = False


OPERATOR = Caller(ANONYMOUS, admin=True)
"""The caller of a gateway served without keys: only reachable on loopback, it sees all."""


class KeyVerifier(Protocol):
    """Names the active key a presented secret belongs to (``keys.ApiKeyStore``)."""

    def verify(self, key: str) -> KeyIdentity | None: ...


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header; None when absent or malformed."""
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


def may_read(owner: str | None, caller: Caller) -> bool:
    """Whether ``caller`` may read a request made with the key whose id is ``owner``.

    Only the key that made a request reads it, and admins; a request made without keys is
    readable by all. Refusals are answered as 404 (not 403), so foreign request ids do not leak.
    """
    return caller.admin or owner is ANONYMOUS or owner == caller.key_id


def request_caller(request: Request) -> Caller:
    """The caller ``require_api_key`` recorded on ``request`` (the operator when none did)."""
    caller = getattr(request.state, "caller", OPERATOR)
    return caller if isinstance(caller, Caller) else OPERATOR


def invalid_api_key(message: str) -> HttpError:
    return HttpError(401, "invalid_api_key", message)


def api_key_dependency(verifier: KeyVerifier | None) -> Callable[[Request], Awaitable[None]]:
    """A FastAPI dependency that sets ``request.state.caller`` or raises a 401.

    With no verifier (``--allow-anonymous``) every request passes as the operator.
    """

    async def require_api_key(request: Request) -> None:
        if verifier is None:
            request.state.caller = OPERATOR
            return
        token = bearer_token(request.headers.get("authorization"))
        if token is None:
            raise invalid_api_key(
                "missing API key: send 'Authorization: Bearer YOUR_KEY' "
                "(create one with `meshnet swarm api-key create NAME`)"
            )
        identity = verifier.verify(token)
        if identity is None:
            raise invalid_api_key("incorrect API key provided")
        request.state.caller = Caller(identity.key_id, identity.admin)

    return require_api_key
