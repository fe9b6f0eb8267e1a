"""A work record as the route tests file it (one node served every layer)."""

from __future__ import annotations

from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.tracking import NodeWork, WorkRecord


def record(request_id: str, status: str = "completed", tokens_out: int = 4) -> WorkRecord:
    return WorkRecord(
        request_id=RequestId(request_id),
        model="tiny",
        status=status,  # type: ignore[arg-type]
        tokens_in=3,
        tokens_out=tokens_out,
        attribution=(NodeWork(NodeId("n-a"), LayerRange(0, 6), 3 + tokens_out),),
        billing_units=0.75 + tokens_out,
        started_at=100.0,
        finished_at=101.0,
        session_id=SessionId("s-1"),
    )
