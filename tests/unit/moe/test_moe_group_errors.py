"""Which node an expert group's failed step names: the one that could not be reached.

Since a peer's bare CANCELLED is a lost peer (``wire.status``), a live node that cancelled its
step when its group broke is an ``Unavailable`` too; the step must still name the dead node, not
the survivor that gave up on it (the expert-group test's "fails fast" names node 1).
"""

from __future__ import annotations

import grpc

from meshnet.core.errors import Cancelled, MeshnetError, Unavailable
from meshnet.moe import group_client
from meshnet.wire.status import error_metadata

ADDRESSES = ["127.0.0.1:7001", "127.0.0.1:7002"]


class EndedCall(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__()
        self._code, self._details, self._metadata = code, details, metadata

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


async def outcome_of(error: EndedCall) -> MeshnetError:
    async def failing() -> None:
        raise error

    outcome = await group_client._outcome(failing())  # type: ignore[arg-type]
    assert isinstance(outcome, MeshnetError)
    return outcome


async def test_the_dead_node_is_named_not_the_survivor_that_cancelled_its_step() -> None:
    survivor = await outcome_of(EndedCall(grpc.StatusCode.CANCELLED, "CANCELLED"))
    dead = await outcome_of(EndedCall(grpc.StatusCode.UNAVAILABLE, "Socket closed"))
    assert isinstance(survivor, Unavailable) and isinstance(dead, Unavailable)
    named = group_client._group_error([(0, survivor), (1, dead)], ADDRESSES)
    assert isinstance(named, Unavailable) and "node 1" in named.message
    # Alone, a cancelled step is still a lost worker (never a client cancellation).
    alone = group_client._group_error([(0, survivor)], ADDRESSES)
    assert isinstance(alone, Unavailable) and "node 0" in alone.message


async def test_a_node_s_own_cancellation_keeps_its_type() -> None:
    deliberate = EndedCall(grpc.StatusCode.CANCELLED, "stop", error_metadata(Cancelled("stop")))
    assert type(await outcome_of(deliberate)) is Cancelled
