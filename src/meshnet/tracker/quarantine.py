"""Whether the tracker takes a quarantine order: who gives it, and what its evidence shows.

The tracker trusts no verdict it is told: it applies the audit's own rule
(``route.audit_verdicts.evidence_blames``) to the runs the order carries, and quarantines only
the node they isolate. The record an order marks ``unverified`` must be one of the audited
requests whose original route went through that node. An admin may order without evidence
(an operator's decision); a gateway never.
"""

from __future__ import annotations

from meshnet.core.errors import InvalidArgument
from meshnet.core.tracking import QuarantineOrder
from meshnet.route.audit_verdicts import evidence_blames
from meshnet.security.identity import PeerIdentity
from meshnet.security.policy import authorize_quarantine
from meshnet.wire.tls import enforce


def check_quarantine_order(peer: PeerIdentity | None, order: QuarantineOrder) -> None:
    """Raise PermissionDenied (no evidence, not an admin) or InvalidArgument (evidence that does
    not isolate the node, or a record it does not concern). ``peer`` None: a plaintext tracker,
    which knows no identities (nothing is refused for want of one)."""
    if peer is not None:
        enforce(authorize_quarantine(peer, with_evidence=order.evidence is not None))
    evidence = order.evidence
    if evidence is None:
        return
    blamed = evidence_blames(evidence)
    if blamed != order.node_id:
        isolates = "no node" if blamed is None else f"node {blamed}"
        raise InvalidArgument(f"the evidence ({evidence.rule}) isolates {isolates}, not node {order.node_id}")
    if order.request_id is not None:
        served = {audit.request_id for audit in evidence.audits if order.node_id in audit.original.members}
        if order.request_id not in served:
            raise InvalidArgument(f"request {order.request_id} is not an audited request node {order.node_id} served")
