"""The tracker's verdict on a joining node's certification, as pure functions: no model, no node.

The reports are written by hand (``tracker_samples.certification``); each case breaks one thing
a real report binds, and the verdict must name it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tracker_samples import LOGITS_SHA256, OTHER_RECIPE, RECIPE, certification, registration

from meshnet.core.errors import Uncertified
from meshnet.core.ids import NodeId
from meshnet.core.node_record import Certification
from meshnet.tracker.certification import certification_problem, check_certified, digest_conflict


def test_a_report_that_certifies_the_registered_recipe_passes() -> None:
    record = registration(0, 20)
    assert certification_problem(record) is None
    check_certified(record, [(NodeId("n-1"), registration(0, 10, address="b:1"))])


@pytest.mark.parametrize(
    ("report", "reason"),
    [
        (certification(OTHER_RECIPE), "certification is of recipe"),
        (certification(replace(RECIPE, backend_version="0.3.99")), "certification is of recipe"),
        (
            Certification.seal(RECIPE.fingerprint(), "0.3.99", ("checked",), LOGITS_SHA256, LOGITS_SHA256),
            "ran on backend 0.3.99, but its recipe serves backend 0.3.36",
        ),
        (Certification.seal(RECIPE.fingerprint(), "0.3.36", (), LOGITS_SHA256, LOGITS_SHA256), "lists no checks"),
        (certification(split="cd" * 32), "does not split bit-identically"),
        # Findings changed after the node sealed them: the digest no longer describes the report.
        (replace(certification(), checks=("something else",)), "does not match the report"),
        (replace(certification(), split_sha256="cd" * 32), "does not match the report"),
    ],
)
def test_a_report_that_does_not_certify_the_registered_recipe_is_refused_naming_why(
    report: Certification, reason: str
) -> None:
    record = registration(0, 20, report=report)
    problem = certification_problem(record)
    assert problem is not None and reason in problem
    with pytest.raises(Uncertified, match=reason):
        check_certified(record, [])


def test_digests_are_compared_only_within_a_recipe() -> None:
    ours = registration(0, 20, report=certification(whole="cd" * 32))
    others = [
        (NodeId("x"), registration(0, 20, address="x:1", recipe=OTHER_RECIPE, report=certification(OTHER_RECIPE)))
    ]
    assert digest_conflict(ours, others) is None
    same = [(NodeId("y"), registration(0, 10, address="y:1"))]
    evidence = digest_conflict(ours, same)
    assert evidence is not None and "node y at y:1" in evidence
    assert LOGITS_SHA256 in evidence and "cd" * 32 in evidence
