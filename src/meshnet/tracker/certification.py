"""Whether a joining node's certification certifies what it registers: pure verdicts.

A worker certifies its engine at start-up (``engine.certification``) and registers the report
with its record. The tracker trusts no verdict it is told: it recomputes one from the report
(``certification_problem``) and checks the report against the recipe the node registers, then
checks that the node computed what the recipe's other live nodes computed (``digest_conflict``):
the synthetic models and the pinned build are deterministic, so every honest node of a recipe
presents the same whole-model digest, and one that does not would break bit-identity silently.

Why live nodes, not the first node ever: a reference that outlived its nodes would lock a whole
recipe out for good if that node's build was the odd one; among live nodes the evidence is
always someone an operator can inspect. Everything here is a function of its arguments.
"""

from __future__ import annotations

from collections.abc import Iterable

from meshnet.core.errors import Uncertified
from meshnet.core.ids import NodeId
from meshnet.core.node_record import NodeRecord


def certification_problem(record: NodeRecord) -> str | None:
    """Why ``record``'s certification does not certify what it registers; None when it does."""
    report, recipe = record.certification, record.recipe
    if report.digest != report.recomputed_digest:
        return f"its certification digest {report.digest[:16]} does not match the report it came with"
    if report.fingerprint != record.fingerprint:
        return f"its certification is of recipe {report.fingerprint}, but it registers recipe {record.fingerprint}"
    if report.backend_version != recipe.backend_version:
        return (
            f"its certification ran on backend {report.backend_version}, but its recipe serves "
            f"backend {recipe.backend_version}"
        )
    if not report.checks:
        return "its certification lists no checks"
    if report.split_sha256 != report.whole_sha256:
        return (
            f"its split logits (sha256 {report.split_sha256[:16]}) differ from the whole model's "
            f"({report.whole_sha256[:16]}): its engine does not split bit-identically"
        )
    return None


def digest_conflict(record: NodeRecord, peers: Iterable[tuple[NodeId, NodeRecord]]) -> str | None:
    """The evidence that ``record`` computed other numbers than a live node of its recipe; None
    when it agrees with them (or is the recipe's only node)."""
    for node_id, peer in peers:
        if peer.fingerprint != record.fingerprint:
            continue
        theirs, ours = peer.certification.whole_sha256, record.certification.whole_sha256
        if theirs == ours:
            return None  # the recipe's live nodes all agree, so one agreeing peer settles it
        return (
            f"node {node_id} at {peer.address} certified recipe {record.fingerprint} with whole-model "
            f"logits sha256 {theirs}, this node's certification computed {ours}: its build computes "
            "different numbers, so its splits would not match theirs"
        )
    return None


def check_certified(record: NodeRecord, peers: Iterable[tuple[NodeId, NodeRecord]]) -> None:
    """Raise ``Uncertified`` naming why, unless ``record`` may be routed to."""
    problem = certification_problem(record) or digest_conflict(record, peers)
    if problem is not None:
        raise Uncertified(f"refusing node {record.address} (layers {record.layers} of {record.model}): {problem}")
