"""tracker.proto's work messages <-> core values: the records gateways file (``ReportWork``) and
the audit's verdicts on them (``Quarantine``). The membership and routing messages are in
``tracker_wire``; the same rules hold: decoded into validated values at the edge."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from meshnet.core.audit_evidence import (
    MAX_AUDITS,
    MAX_RUNS,
    VERDICT_RULES,
    AuditedRequest,
    AuditRun,
    QuarantineEntry,
    QuarantineEvidence,
    VerdictRule,
)
from meshnet.core.checks import check_text
from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.tracking import (
    MAX_SESSIONS_PER_REPORT,
    NodeWork,
    Quarantined,
    QuarantineOrder,
    SessionTokens,
    WorkAck,
    WorkRecord,
    WorkStatus,
)
from meshnet.wire.generated import tracker_pb2 as pb
from meshnet.wire.tracker_wire import node_id_from_proto

_STATUS_TO_PROTO: dict[WorkStatus, pb.WorkRecord.Status] = {
    "completed": pb.WorkRecord.STATUS_COMPLETED,
    "cancelled": pb.WorkRecord.STATUS_CANCELLED,
    "failed": pb.WorkRecord.STATUS_FAILED,
    "unverified": pb.WorkRecord.STATUS_UNVERIFIED,
}
_STATUS_FROM_PROTO: dict[int, WorkStatus] = {value: name for name, value in _STATUS_TO_PROTO.items()}


# --- ReportWork ---------------------------------------------------------------------------------


def _status_to_proto(status: WorkStatus) -> pb.WorkRecord.Status:
    encoded = _STATUS_TO_PROTO.get(status)
    if encoded is None:
        raise InvalidArgument(f"work status {status!r} is a verdict only the tracker sets, never a report")
    return encoded


def work_to_proto(record: WorkRecord) -> pb.WorkRecord:
    return pb.WorkRecord(
        request_id=record.request_id,
        session_id=record.session_id or "",
        model=record.model,
        status=_status_to_proto(record.status),
        tokens_in=record.tokens_in,
        tokens_out=record.tokens_out,
        attribution=[
            pb.WorkRecord.NodeShare(
                node_id=share.node_id,
                layer_start=share.layers.start,
                layer_stop=share.layers.stop,
                tokens=share.tokens,
            )
            for share in record.attribution
        ],
        billing_units=record.billing_units,
        started_at_unix_s=record.started_at,
        finished_at_unix_s=record.finished_at,
    )


def work_from_proto(message: pb.WorkRecord) -> WorkRecord:
    status = _STATUS_FROM_PROTO.get(message.status)
    if status is None:
        raise InvalidArgument(f"work record status {message.status} is not completed, cancelled, failed or unverified")
    check_text("request_id", message.request_id)
    return WorkRecord(
        request_id=RequestId(message.request_id),
        session_id=SessionId(message.session_id) if message.session_id else None,
        model=message.model,
        status=status,
        tokens_in=message.tokens_in,
        tokens_out=message.tokens_out,
        attribution=tuple(
            NodeWork(
                node_id=node_id_from_proto(share.node_id),
                layers=LayerRange(share.layer_start, share.layer_stop),
                tokens=share.tokens,
            )
            for share in message.attribution
        ),
        billing_units=message.billing_units,
        started_at=message.started_at_unix_s,
        finished_at=message.finished_at_unix_s,
    )


def work_ack_to_proto(ack: WorkAck) -> pb.WorkAck:
    return pb.WorkAck(request_id=ack.request_id, duplicate=ack.duplicate)


def work_ack_from_proto(message: pb.WorkAck) -> WorkAck:
    return WorkAck(RequestId(message.request_id), message.duplicate)


# --- Quarantine ---------------------------------------------------------------------------------


def quarantine_to_proto(order: QuarantineOrder) -> pb.QuarantineRequest:
    message = pb.QuarantineRequest(
        node_id=order.node_id, reason=order.reason, request_id=order.request_id or "", clear=order.clear
    )
    if order.evidence is not None:
        message.evidence.CopyFrom(evidence_to_proto(order.evidence))
    return message


def quarantine_from_proto(message: pb.QuarantineRequest) -> QuarantineOrder:
    return QuarantineOrder(
        node_id=node_id_from_proto(message.node_id),
        reason=message.reason,
        request_id=RequestId(message.request_id) if message.request_id else None,
        clear=message.clear,
        evidence=evidence_from_proto(message.evidence) if message.HasField("evidence") else None,
    )


def quarantine_list_to_proto(entries: Sequence[QuarantineEntry]) -> pb.QuarantineList:
    nodes = []
    for entry in entries:
        node = pb.QuarantinedNode(
            node_id=entry.node_id, reason=entry.reason, request_id=entry.request_id or "", since_unix_s=entry.since
        )
        if entry.evidence is not None:
            node.evidence.CopyFrom(evidence_to_proto(entry.evidence))
        nodes.append(node)
    return pb.QuarantineList(nodes=nodes)


def quarantine_list_from_proto(message: pb.QuarantineList) -> tuple[QuarantineEntry, ...]:
    return tuple(
        QuarantineEntry(
            node_id_from_proto(node.node_id),
            node.reason,
            RequestId(node.request_id) if node.request_id else None,
            node.since_unix_s,
            evidence_from_proto(node.evidence) if node.HasField("evidence") else None,
        )
        for node in message.nodes
    )


def evidence_to_proto(evidence: QuarantineEvidence) -> pb.QuarantineEvidence:
    return pb.QuarantineEvidence(
        rule=evidence.rule,
        audits=[
            pb.AuditedRequest(
                request_id=audit.request_id,
                runs=[pb.AuditRun(nodes=list(run.nodes), output=run.output) for run in audit.runs],
            )
            for audit in evidence.audits
        ],
    )


def evidence_from_proto(message: pb.QuarantineEvidence) -> QuarantineEvidence:
    """Validated at the edge: sizes, ids and the rule's name (``core.audit_evidence``)."""
    if not 1 <= len(message.audits) <= MAX_AUDITS or any(not 1 <= len(a.runs) <= MAX_RUNS for a in message.audits):
        raise InvalidArgument(f"evidence lists 1 to {MAX_AUDITS} requests of 1 to {MAX_RUNS} runs each")
    audits = tuple(
        AuditedRequest(
            RequestId(audit.request_id),
            tuple(AuditRun(tuple(NodeId(node) for node in run.nodes), run.output) for run in audit.runs),
        )
        for audit in message.audits
    )
    if message.rule not in VERDICT_RULES:
        raise InvalidArgument(f"unknown verdict rule {message.rule!r}; known: {', '.join(VERDICT_RULES)}")
    return QuarantineEvidence(cast(VerdictRule, message.rule), audits)


def quarantined_to_proto(reply: Quarantined) -> pb.QuarantineReply:
    return pb.QuarantineReply(known=reply.known, record_marked=reply.record_marked, epoch=reply.epoch)


def quarantined_from_proto(message: pb.QuarantineReply) -> Quarantined:
    return Quarantined(message.known, message.record_marked, message.epoch)


# --- ReportSessionTokens ------------------------------------------------------------------------


def session_tokens_to_proto(node_id: NodeId, sessions: tuple[SessionTokens, ...]) -> pb.SessionTokensReport:
    return pb.SessionTokensReport(
        node_id=node_id,
        sessions=[
            pb.SessionTokensReport.Session(
                session_id=count.session_id,
                route_epoch=count.route_epoch,
                positions=count.positions,
                prompt_tokens=count.prompt_tokens,
            )
            for count in sessions
        ],
    )


def session_tokens_from_proto(message: pb.SessionTokensReport) -> tuple[NodeId, tuple[SessionTokens, ...]]:
    if len(message.sessions) > MAX_SESSIONS_PER_REPORT:
        raise InvalidArgument(f"at most {MAX_SESSIONS_PER_REPORT} sessions in one report, got {len(message.sessions)}")
    return node_id_from_proto(message.node_id), tuple(
        SessionTokens(SessionId(count.session_id), count.route_epoch, count.positions, count.prompt_tokens)
        for count in message.sessions
    )


def session_tokens_ack_to_proto(counted: int) -> pb.SessionTokensAck:
    return pb.SessionTokensAck(counted=counted)


def session_tokens_ack_from_proto(message: pb.SessionTokensAck) -> int:
    return message.counted
