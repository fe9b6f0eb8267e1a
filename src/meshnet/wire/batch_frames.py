"""Typed frozen values of the ring's batch streams (``Shard.RingBatch``, ``Shard.RingReturnBatch``)
beside the rows themselves (``frames.StepFrame``, ``frames.StepResult``): what a receiver refused,
what a leg lost, and why a session's ring ended. Nothing here imports grpc or the generated code.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshnet.core.ids import UNKNOWN_INCARNATION, LegIncarnation


@dataclass(frozen=True, slots=True)
class RefusedRow:
    """A row of a ring batch that no session on the receiver took (``Shard.RingBatch``): dropped
    alone; the batch stream and its other rows carry on."""

    session_id: str
    """As the row named it: possibly no valid session id at all."""
    step: int
    reason: str
    incarnation: LegIncarnation = UNKNOWN_INCARNATION
    """The row's leg incarnation, echoed (``UNKNOWN_INCARNATION``: an older sender or receiver)."""


@dataclass(frozen=True, slots=True)
class LostRow:
    """A ring row that did not, or may not, reach the next hop (``RowOwner.row_lost``)."""

    step: int | None
    """The refused row's step; None: the owner's last row, whose batch stream broke unanswered."""
    incarnation: LegIncarnation
    """The leg that sent it, as the refusal echoed it (``UNKNOWN_INCARNATION``: not echoed, an
    older receiver); on a broken stream, the owner's own."""


@dataclass(frozen=True, slots=True)
class RingEnded:
    """A session's ring ended on the tail (``Shard.RingReturnBatch``): why, as its typed error's
    code and message; no answer of the session follows."""

    session_id: str
    code: str
    message: str
