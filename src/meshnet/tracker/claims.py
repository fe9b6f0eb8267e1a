"""How far the tracker believes a node's self-declared speed: outlier claims are not trusted.

A worker reports the decode rate it measured itself; nothing stops a rogue (or a misconfigured)
node from claiming 1e9 tok/s and winning every route. Until the tracker measures compute
itself, a claim is judged against the other nodes of the same recipe: per layer, a node may
claim at most ``MAX_CLAIM_RATIO`` times the lower median of its peers' claims; a claim beyond
that counts as the lower median. The lower median is taken so that one liar among two nodes
cannot drag the reference up. A node alone with its recipe has nothing to be checked against.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from meshnet.tracker.routing import NodeView

MAX_CLAIM_RATIO = 32.0
"""Generous: a GPU node beside CPU nodes may honestly be 10-30x faster per layer. What it stops
is the unbounded claim (1e9 tok/s) that would win every route whatever the others offer."""


def credible_views(views: Sequence[NodeView], max_ratio: float = MAX_CLAIM_RATIO) -> tuple[NodeView, ...]:
    """``views`` with every implausible decode-rate claim replaced by its recipe's lower median."""
    per_layer: dict[str, list[float]] = {}
    for view in views:
        if view.decode_tokens_per_s > 0:
            per_layer.setdefault(view.fingerprint, []).append(view.decode_tokens_per_s * len(view.layers))
    reference = {fingerprint: statistics.median_low(rates) for fingerprint, rates in per_layer.items()}
    believed = []
    for view in views:
        median = reference.get(view.fingerprint)
        claimed = view.decode_tokens_per_s * len(view.layers)
        if median is not None and claimed > max_ratio * median:
            view = replace(view, decode_tokens_per_s=median / len(view.layers))
        believed.append(view)
    return tuple(believed)
