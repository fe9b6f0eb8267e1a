"""Distinct id types, so a session id is never passed where a request id belongs."""

from __future__ import annotations

import secrets
from typing import NewType

SessionId = NewType("SessionId", str)
RequestId = NewType("RequestId", str)
NodeId = NewType("NodeId", str)


def new_session_id() -> SessionId:
    return SessionId("s-" + secrets.token_hex(8))


def new_request_id() -> RequestId:
    return RequestId("req-" + secrets.token_hex(8))
