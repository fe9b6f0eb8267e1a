"""Each ring batch row carries its sending leg's incarnation and a refusal echoes it
(``wire.batch_wire``); a peer from before incarnations sends and echoes none, read as 0."""

from __future__ import annotations

import numpy as np

from meshnet.core.ids import UNKNOWN_INCARNATION, LegIncarnation, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.wire.batch_frames import RefusedRow
from meshnet.wire.batch_wire import batch_to_proto, refused_from_proto, refused_to_proto, row_incarnation
from meshnet.wire.frames import FrameMeta, StepFrame
from meshnet.wire.generated import shard_pb2 as pb


def ring_row(session: str, step: int) -> StepFrame:
    meta = FrameMeta(
        request_id=RequestId("req-1"),
        session_id=SessionId(session),
        route_epoch=3,
        fingerprint="rcp-1",
        layers=LayerRange(3, 6),
        phase="decode",
        position=10 + step,
        step=step,
        cache="continue",
    )
    return StepFrame(meta, hidden=np.ones((1, 8), np.float32), ring=True)


def test_each_row_carries_its_legs_incarnation_and_a_refusal_echoes_it() -> None:
    old, new = LegIncarnation(2**64 - 1), LegIncarnation(7)
    batch = pb.StepBatch.FromString(
        batch_to_proto([(ring_row("s-1", 6), old), (ring_row("s-1", 6), new)]).SerializeToString()
    )
    assert [row_incarnation(row) for row in batch.rows] == [old, new]
    refused = [RefusedRow("s-1", 6, "no such session", row_incarnation(row)) for row in batch.rows]
    ack = pb.BatchAck.FromString(refused_to_proto(refused).SerializeToString())
    assert refused_from_proto(ack) == tuple(refused)


def test_an_older_peer_sends_and_echoes_no_incarnation() -> None:
    older_row = pb.StepRequest(header=pb.FrameHeader(session_id="s-1", step=6))
    assert row_incarnation(older_row) == UNKNOWN_INCARNATION
    older_ack = pb.BatchAck(refused=[pb.RefusedRow(session_id="s-1", step=6, reason="gone")])
    assert refused_from_proto(older_ack) == (RefusedRow("s-1", 6, "gone", UNKNOWN_INCARNATION),)
