"""shard.proto's ring batch messages (``StepBatch``, ``BatchAck``, ``RingSubscribe``,
``StepResponseBatch``) <-> typed values.

A batch is only an envelope: each row is a whole ``StepRequest``, decoded by ``frame_from_proto``
exactly as on its session's own stream, by that session's stream handler. Here only what routing
a row needs is read: the session it names.
"""

from __future__ import annotations

from collections.abc import Sequence

from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import LegIncarnation, RequestId, SessionId
from meshnet.wire.batch_frames import RefusedRow, RingEnded
from meshnet.wire.frames import MAX_ID_CHARS, StepFrame, StepResult
from meshnet.wire.generated import shard_pb2 as pb
from meshnet.wire.shard_wire import frame_to_proto, result_from_proto, result_to_proto, ring_open_to_proto

MAX_BATCH_ROWS = 256
"""Rows one batch may carry: above any shard's session slots, so a sender never needs more."""


def batch_to_proto(rows: Sequence[tuple[StepFrame, LegIncarnation]]) -> pb.StepBatch:
    """A batch of ring rows, each tagged with the incarnation of the leg that sends it."""
    message = pb.StepBatch()
    for frame, incarnation in rows:
        row = frame_to_proto(frame)
        row.leg_incarnation = incarnation
        message.rows.append(row)
    return message


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


def row_epoch(row: pb.StepRequest) -> int:
    """The route epoch a row names, unchecked: only compared with its session's."""
    return int(row.header.route_epoch)


def row_incarnation(row: pb.StepRequest) -> LegIncarnation:
    """The sending leg's incarnation, only ever echoed (0 from an older sender)."""
    return LegIncarnation(row.leg_incarnation)


def refused_to_proto(refused: Sequence[RefusedRow]) -> pb.BatchAck:
    return pb.BatchAck(
        refused=[
            pb.RefusedRow(session_id=r.session_id, step=r.step, reason=r.reason[:1024], leg_incarnation=r.incarnation)
            for r in refused
        ]
    )


def refused_from_proto(message: pb.BatchAck) -> tuple[RefusedRow, ...]:
    return tuple(
        RefusedRow(r.session_id[:MAX_ID_CHARS], r.step, r.reason[:1024], LegIncarnation(r.leg_incarnation))
        for r in message.refused
    )


def subscribe_to_proto(sessions: Sequence[tuple[SessionId, RequestId]]) -> pb.RingSubscribe:
    return pb.RingSubscribe(sessions=[ring_open_to_proto(session, request) for session, request in sessions])


def subscribed(message: pb.RingSubscribe) -> Sequence[pb.RingOpen]:
    """The sessions a head subscribes, each still to be checked by ``ring_open_from_proto``."""
    if len(message.sessions) > MAX_BATCH_ROWS:
        raise InvalidArgument(f"a ring subscription names at most {MAX_BATCH_ROWS} sessions")
    return message.sessions


def answers_to_proto(items: Sequence[StepResult | RingEnded]) -> pb.StepResponseBatch:
    message = pb.StepResponseBatch()
    for item in items:
        if isinstance(item, RingEnded):
            message.ended.add(session_id=item.session_id, code=item.code, message=item.message[:1024])
        else:
            message.answers.append(result_to_proto(item))
    return message


def answers_from_proto(message: pb.StepResponseBatch) -> tuple[tuple[StepResult, ...], tuple[RingEnded, ...]]:
    """The answers of one engine step of the tail, and the rings that ended there."""
    answers = tuple(result_from_proto(answer) for answer in message.answers)
    ended = tuple(RingEnded(e.session_id[:MAX_ID_CHARS], e.code[:64], e.message[:1024]) for e in message.ended)
    return answers, ended
