"""The audit's decisions, as pure functions: which request to sample, which route to try next,
and which node to blame, from one request's runs or from many requests' suspects.

Splits are bit-identical (certified engines, one recipe fingerprint per route), so two honest
routes produce exactly the same tokens for the same prompt and sampling; a difference means a
node computed something else. The audit runs a finished request again on other routes; each
run (the user's original first) is its route's nodes and a digest of its tokens
(``core.audit_evidence``).

A faulty node need not be consistent: it may compute honestly on some runs (those it takes
for audits, say: a prompt it saw before) and lie on others. So no run is believed for what it
is, and blame assumes only that one node is faulty among those a request's runs touched:

- The *reference* (the right output) is established only by two runs on disjoint node sets
  that agree: one of them avoided the faulty node, so both are right. Two different such
  outputs mean more than one fault: no reference, nobody blamed.
- Every run that differs from the reference went through the faulty node, which is therefore
  in the intersection of their routes: that intersection is the *suspects*. One suspect is
  the culprit (rule ``one_request``). Runs that agree with the reference clear nobody (a liar
  may have computed honestly on them).
- Several suspects (the original alone differs: a node honest on every replay) is
  ``undecided``, never ``clean``; the audit tries more routes, and keeps the request as an
  *unreproducible original*. Across requests (rule ``across_requests``), the one node on the
  route of every unreproducible original in the window (at least ``ACROSS_MIN`` of them) is
  the culprit.

On an honest swarm every run of a request agrees, so no request is ever unreproducible and no
node is ever blamed, by either rule. The rules assume one faulty node among the nodes a
request's runs used (and say nothing, rather than guess, when faults contradict each other).
Two faulty nodes break that: colluding or not, two rogues whose unreproducible originals each
shared one honest node (their common tail, say) make ``across_requests`` name that node, since
{R1, T}, {R2, T} reads exactly as {R, T1}, {R, T2}. Measured in the lab by accident (two rogues
left live at once); not yet answered here.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from meshnet.core.audit_evidence import AuditedRequest, AuditRun, QuarantineEvidence
from meshnet.core.ids import NodeId

SAMPLE_RESOLUTION = 1 << 32
ACROSS_MIN = 2
"""Unreproducible originals that must share exactly one node before it is blamed across requests."""

VerdictKind = Literal["clean", "caught", "undecided"]


def should_audit(request_id: str, fraction: float) -> bool:
    """Whether ``request_id`` is in the audited sample: a hash of the id, not a random draw, so
    a gateway restart samples the same requests and a test can force every one (``1.0``)."""
    if fraction <= 0:
        return False
    if fraction >= 1:
        return True
    digest = hashlib.sha256(request_id.encode()).digest()
    return int.from_bytes(digest[:4], "big") < fraction * SAMPLE_RESOLUTION


def output_digest(key: bytes, tokens: Sequence[int]) -> str:
    """The keyed digest of a run's tokens: equal iff the tokens are, for one audit's ``key``."""
    body = b"".join(int(token).to_bytes(4, "little", signed=True) for token in tokens)
    return hmac.new(key, body, hashlib.sha256).hexdigest()[:32]


@dataclass(frozen=True)
class Verdict:
    """What the runs so far say about one audited request."""

    kind: VerdictKind = "clean"
    culprit: NodeId | None = None
    """The one node the evidence isolates (``caught``)."""
    suspects: frozenset[NodeId] = frozenset()
    """Nodes that may be at fault (empty when clean, or when faults contradict each other)."""
    reference: str | None = None
    """The output established right (two disjoint runs agree), if any."""
    unreproducible: bool = False
    """The original differs from the established reference: some node of its route lied on it."""

    @property
    def clean(self) -> bool:
        return self.kind == "clean"


def reference_of(runs: Sequence[AuditRun]) -> str | None:
    """The output two runs on disjoint node sets agree on, if exactly one such output exists."""
    agreed = {
        first.output
        for first, second in itertools.combinations(runs, 2)
        if first.output == second.output and not (first.members & second.members)
    }
    return next(iter(agreed)) if len(agreed) == 1 else None


def judge(runs: Sequence[AuditRun]) -> Verdict:
    """The verdict of ``runs``: the original first, then every replay that finished."""
    if len({run.output for run in runs}) <= 1:
        return Verdict()
    seen = frozenset().union(*(run.members for run in runs))
    reference = reference_of(runs)
    if reference is None:
        return Verdict("undecided", suspects=seen)
    wrong = [run.members for run in runs if run.output != reference]
    suspects = frozenset.intersection(*wrong)
    unreproducible = runs[0].output != reference
    if len(suspects) == 1:
        return Verdict("caught", next(iter(suspects)), suspects, reference, unreproducible)
    return Verdict("undecided", None, suspects, reference, unreproducible)


def blame_across(suspect_sets: Sequence[frozenset[NodeId]]) -> NodeId | None:
    """The one node on the route of every unreproducible original (at least ``ACROSS_MIN``)."""
    if len(suspect_sets) < ACROSS_MIN:
        return None
    common = frozenset.intersection(*suspect_sets)
    return next(iter(common)) if len(common) == 1 else None


def evidence_blames(evidence: QuarantineEvidence) -> NodeId | None:
    """The node ``evidence`` isolates by its own rule, or None: what the tracker checks an order by."""
    verdicts = [judge(audit.runs) for audit in evidence.audits]
    if evidence.rule == "one_request":
        return verdicts[0].culprit
    if not all(v.kind == "undecided" and v.unreproducible and v.suspects for v in verdicts):
        return None
    return blame_across([v.suspects for v in verdicts])


def unexplained(audits: Iterable[AuditedRequest]) -> list[AuditedRequest]:
    """The audits whose original no replay reproduced and no one request explains."""
    kept = []
    for audit in audits:
        verdict = judge(audit.runs)
        if verdict.kind == "undecided" and verdict.unreproducible and verdict.suspects:
            kept.append(audit)
    return kept


def first_exclusion(original: frozenset[NodeId]) -> frozenset[NodeId]:
    """The first audit route avoids every node of the original: one replay checks them all."""
    return original


def next_exclusions(
    runs: Sequence[AuditRun], verdict: Verdict, tried: Iterable[frozenset[NodeId]]
) -> tuple[frozenset[NodeId], ...]:
    """Exclusion sets worth asking the tracker for next, most telling first.

    Without a reference: routes around each run so far (a disjoint run that agrees makes one),
    then around each node seen, then each pair (a third opinion for a pair's layers). With one:
    around each suspect, then each pair of suspects, so the wrong runs' common nodes shrink.
    """
    done = set(tried)
    seen = sorted(frozenset().union(*(run.members for run in runs)))
    if verdict.reference is None:
        pool = seen
        arounds = [run.members for run in runs]
    else:
        pool = sorted(verdict.suspects) if verdict.suspects else seen
        arounds = []
    singles = [frozenset({node}) for node in pool]
    pairs = [frozenset(pair) for pair in itertools.combinations(pool, 2)]
    ordered = dict.fromkeys(exclusion for exclusion in [*arounds, *singles, *pairs] if exclusion not in done)
    return tuple(ordered)
