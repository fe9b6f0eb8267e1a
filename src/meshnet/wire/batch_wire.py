"""shard.proto's ring batch messages (``StepBatch``, ``BatchAck``) <-> typed values.

A batch is only an envelope: each row is a whole ``StepRequest``, decoded by ``frame_from_proto``
exactly as on its session's own stream, by that session's stream handler. Here only what routing
a row needs is read: the session it names.
"""

from __future__ import annotations

from collections.abc import Sequence

from meshnet.core.errors import InvalidArgument
from meshnet.wire.frames import MAX_ID_CHARS, RefusedRow, StepFrame
from meshnet.wire.generated import shard_pb2 as pb
from meshnet.wire.shard_wire import frame_to_proto

MAX_BATCH_ROWS = 256
"""Rows one batch may carry: above any shard's session slots, so a sender never needs more."""


def batch_to_proto(frames: Sequence[StepFrame]) -> pb.StepBatch:
    return pb.StepBatch(rows=[frame_to_proto(frame) for frame in frames])


def batch_rows(message: pb.StepBatch) -> Sequence[pb.StepRequest]:
    """The rows of a received batch, each still to be decoded by its session's handler."""
    if len(message.rows) > MAX_BATCH_ROWS:
        raise InvalidArgument(f"a ring batch carries at most {MAX_BATCH_ROWS} rows, got {len(message.rows)}")
    return message.rows


def row_session(row: pb.StepRequest) -> str:
    """The session id a row names, unchecked beyond its length ('' for none): only looked up."""
    session_id = row.header.session_id
    return session_id if len(session_id) <= MAX_ID_CHARS else ""


def row_step(row: pb.StepRequest) -> int:
    return int(row.header.step)


def refused_to_proto(refused: Sequence[RefusedRow]) -> pb.BatchAck:
    return pb.BatchAck(
        refused=[pb.RefusedRow(session_id=r.session_id, step=r.step, reason=r.reason[:1024]) for r in refused]
    )


def refused_from_proto(message: pb.BatchAck) -> tuple[RefusedRow, ...]:
    return tuple(RefusedRow(r.session_id[:MAX_ID_CHARS], r.step, r.reason[:1024]) for r in message.refused)
