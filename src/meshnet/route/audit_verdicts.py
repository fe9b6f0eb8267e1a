"""The audit's decisions, as pure functions: which request to sample, which route to try next,
and which node to blame.

Splits are bit-identical (certified engines, one recipe fingerprint per route), so two honest
routes produce exactly the same tokens for the same prompt and sampling; a difference means a
node computed something else. The audit replays a finished request on other routes and records,
for each one, only whether it agreed with the original. Blame assumes one deterministic culprit:
every route through it produces the same wrong tokens, every route around it the right ones.
A node ``c`` explains the observations exactly when, for every route tried, "agrees with the
original" equals "``c`` is on it" if ``c`` was on the original route, and "``c`` is not on it"
otherwise. When exactly one node explains them, it is the culprit; when several do (two nodes
for the same layers disagreeing, with no third to side with one), more routes are tried.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from meshnet.core.ids import NodeId

SAMPLE_RESOLUTION = 1 << 32


def should_audit(request_id: str, fraction: float) -> bool:
    """Whether ``request_id`` is in the audited sample: a hash of the id, not a random draw, so
    a gateway restart samples the same requests and a test can force every one (``1.0``)."""
    if fraction <= 0:
        return False
    if fraction >= 1:
        return True
    digest = hashlib.sha256(request_id.encode()).digest()
    return int.from_bytes(digest[:4], "big") < fraction * SAMPLE_RESOLUTION


@dataclass(frozen=True)
class Trial:
    """One replay: the nodes of the route it ran on, and whether its tokens equalled the original's."""

    nodes: frozenset[NodeId]
    agreed: bool


@dataclass(frozen=True)
class Verdict:
    """What the trials so far say about one audited request."""

    culprit: NodeId | None = None
    """The one node that explains every disagreement; None when clean or undecided."""
    suspects: frozenset[NodeId] = frozenset()
    """Nodes that still explain the observations (empty when every trial agreed)."""

    @property
    def clean(self) -> bool:
        return self.culprit is None and not self.suspects


def explains(candidate: NodeId, original: frozenset[NodeId], trials: Iterable[Trial]) -> bool:
    """Whether ``candidate`` being the one faulty node predicts every trial's outcome."""
    on_original = candidate in original
    return all(trial.agreed == ((candidate in trial.nodes) == on_original) for trial in trials)


def judge(original: frozenset[NodeId], trials: Sequence[Trial]) -> Verdict:
    """The verdict of ``trials`` against the original route's nodes ``original``."""
    if all(trial.agreed for trial in trials):
        return Verdict()
    seen = set(original).union(*(trial.nodes for trial in trials))
    suspects = frozenset(node for node in seen if explains(node, original, trials))
    if len(suspects) == 1:
        return Verdict(culprit=next(iter(suspects)), suspects=suspects)
    return Verdict(suspects=suspects)


def first_exclusion(original: frozenset[NodeId]) -> frozenset[NodeId]:
    """The first audit route avoids every node of the original: one replay checks them all."""
    return original


def next_exclusions(
    original: frozenset[NodeId], verdict: Verdict, tried: Iterable[frozenset[NodeId]]
) -> tuple[frozenset[NodeId], ...]:
    """Exclusion sets worth asking the tracker for next, most telling first.

    While nothing disagreed (no route around all of the original was available), each original
    node is left out alone, so each hop is checked against another node for the same layers.
    After a disagreement, each suspect is left out alone, then each pair of suspects (leaving
    out both nodes of a disagreeing pair brings in a third opinion for their layers).
    """
    done = set(tried)
    pool = sorted(verdict.suspects if verdict.suspects else original)
    singles = [frozenset({node}) for node in pool]
    pairs = [frozenset(pair) for pair in itertools.combinations(pool, 2)] if verdict.suspects else []
    return tuple(exclusion for exclusion in [*singles, *pairs] if exclusion not in done)
