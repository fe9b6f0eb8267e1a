"""What an audit saw, as evidence a quarantine order carries and the tracker checks and keeps.

An audit runs one finished request again on other routes. Each run is the route's nodes and a
digest of the tokens it produced; the digest is keyed with a secret the auditor draws for that
one request and forgets, so equal digests mean equal tokens within the request while nothing
about the text leaves the gateway (a digest of a short answer could otherwise be guessed).

A quarantine order names the rule that isolated the node (``route.audit_verdicts``): from the
runs of one request, or from the suspects many requests left. The tracker re-applies the rule
to the evidence before it quarantines anyone, and keeps the evidence beside the quarantine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from meshnet.core.checks import check_text
from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId, RequestId

MAX_RUNS = 32
"""Runs one audited request may list: the original and its replays."""
MAX_AUDITS = 16
"""Audited requests one order may list (the window of evidence across requests)."""
MAX_HOPS = 64

VerdictRule = Literal["one_request", "across_requests"]
"""``one_request``: the runs of one request isolate the node. ``across_requests``: no request
alone does, but the node is the one explanation of several requests' suspects."""
VERDICT_RULES: tuple[VerdictRule, ...] = ("one_request", "across_requests")


@dataclass(frozen=True)
class AuditRun:
    """One run of an audited request: the nodes of its route (in hop order) and its output's digest."""

    nodes: tuple[NodeId, ...]
    output: str
    """The keyed digest of the tokens it produced (equal within one request iff the tokens are)."""

    def __post_init__(self) -> None:
        if not 1 <= len(self.nodes) <= MAX_HOPS:
            raise InvalidArgument(f"an audit run lists 1 to {MAX_HOPS} nodes, got {len(self.nodes)}")
        for node in self.nodes:
            check_text("audit run node id", node)
        check_text("audit run output digest", self.output)

    @property
    def members(self) -> frozenset[NodeId]:
        return frozenset(self.nodes)


@dataclass(frozen=True)
class AuditedRequest:
    """One audited request: its original run (the user's) first, then every replay that finished."""

    request_id: RequestId
    runs: tuple[AuditRun, ...]

    def __post_init__(self) -> None:
        check_text("audited request id", self.request_id)
        if not 1 <= len(self.runs) <= MAX_RUNS:
            raise InvalidArgument(f"an audited request lists 1 to {MAX_RUNS} runs, got {len(self.runs)}")

    @property
    def original(self) -> AuditRun:
        return self.runs[0]


@dataclass(frozen=True)
class QuarantineEvidence:
    """Why the auditor asks the tracker to quarantine a node: the rule and the audits it applied to."""

    rule: VerdictRule
    audits: tuple[AuditedRequest, ...]

    def __post_init__(self) -> None:
        if self.rule not in VERDICT_RULES:
            raise InvalidArgument(f"unknown verdict rule {self.rule!r}; known: {', '.join(VERDICT_RULES)}")
        if not 1 <= len(self.audits) <= MAX_AUDITS:
            raise InvalidArgument(f"evidence lists 1 to {MAX_AUDITS} audited requests, got {len(self.audits)}")
        if self.rule == "one_request" and len(self.audits) != 1:
            raise InvalidArgument("a verdict from one request lists exactly that request")

    def nodes(self) -> frozenset[NodeId]:
        """Every node any run of the evidence went through."""
        return frozenset(node for audit in self.audits for run in audit.runs for node in run.nodes)


@dataclass(frozen=True)
class QuarantineEntry:
    """A quarantined node as the tracker keeps it: why, since when, and the evidence."""

    node_id: NodeId
    reason: str
    request_id: RequestId | None
    """The audited request whose record was marked ``unverified``, if the node served it."""
    since: float
    """Wall-clock seconds (Unix) when the quarantine began."""
    evidence: QuarantineEvidence | None
    """None: an operator's decision (an admin's order needs none)."""


def evidence_to_json(evidence: QuarantineEvidence) -> str:
    """The evidence as the tracker stores it (and ``swarm quarantine list`` shows it)."""
    audits = [
        {
            "request_id": audit.request_id,
            "runs": [{"nodes": list(run.nodes), "output": run.output} for run in audit.runs],
        }
        for audit in evidence.audits
    ]
    return json.dumps({"rule": evidence.rule, "audits": audits}, sort_keys=True, separators=(",", ":"))


def evidence_from_json(text: str) -> QuarantineEvidence:
    try:
        data = json.loads(text)
        audits = tuple(
            AuditedRequest(
                RequestId(audit["request_id"]),
                tuple(AuditRun(tuple(NodeId(node) for node in run["nodes"]), run["output"]) for run in audit["runs"]),
            )
            for audit in data["audits"]
        )
        return QuarantineEvidence(data["rule"], audits)
    except (ValueError, KeyError, TypeError) as error:
        raise InvalidArgument(f"stored quarantine evidence is unreadable: {error}") from error
