"""The span index kept across changes holds what indexing the current views from scratch gives.

Oracle: ``chain_search.spans_of`` over the live views, grouped by recipe (the planner's own indexing
of a plain list of views, which test_chain_search holds against the first planner). Seeded
random joins, re-priced views (rate, queue, room) and departures, with several nodes of equal
cost in one span so that removal must find the right one among ties."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from tracker_samples import OTHER_RECIPE, RECIPE, view

from meshnet.core.ids import NodeId
from meshnet.tracker.chain_search import Spans, spans_of
from meshnet.tracker.route_costs import DEFAULT_COSTS, NodeView
from meshnet.tracker.span_index import SpanIndex


def _flat(spans: dict[tuple[str, int], Spans]) -> Counter[tuple[str, int, int, int, float, NodeId]]:
    """Every entry once, as (recipe, n_layers, start, stop, cost, node), order aside; checks the
    order (cheapest first) and that no span is empty on the way."""
    entries: Counter[tuple[str, int, int, int, float, NodeId]] = Counter()
    for (fingerprint, n_layers), by_start in spans.items():
        for start, by_stop in by_start.items():
            for stop, priced in by_stop.items():
                assert priced, "an empty span"
                costs = [cost for cost, _ in priced]
                assert costs == sorted(costs)
                entries.update((fingerprint, n_layers, start, stop, cost, node.node_id) for cost, node in priced)
    return entries


def _random_view(rng: random.Random, node_id: str) -> NodeView:
    start = rng.choice([0, 0, 5, 10])
    return view(
        node_id,
        start,
        min(start + rng.choice([5, 10]), RECIPE.n_layers),
        rate=rng.choice([0.0, 50.0, 100.0]),  # few values: equal costs are common
        recipe=rng.choice([RECIPE, OTHER_RECIPE]),
        free_sessions=rng.choice([0, 4]),
        queue_depth=rng.choice([0, 1]),
    )


@pytest.mark.parametrize("seed", range(20))
def test_the_kept_spans_equal_spans_built_from_the_live_views(seed: int) -> None:
    rng = random.Random(seed)
    index = SpanIndex(DEFAULT_COSTS)
    live: dict[NodeId, NodeView] = {}
    for _ in range(300):
        node_id = NodeId(f"n{rng.randrange(30)}")
        if node_id in live and rng.random() < 0.3:
            del live[node_id]
        else:
            live[node_id] = _random_view(rng, node_id)  # a join, or the same node re-priced or moved
        index.stale(node_id)
        if rng.random() < 0.3:  # several changes between two replans, as between two routes
            continue
        kept = index.spans(live.get)
        by_recipe: dict[tuple[str, int], list[NodeView]] = {}
        for node in live.values():
            by_recipe.setdefault((node.fingerprint, node.n_layers), []).append(node)
        rebuilt = {key: spans_of(nodes, DEFAULT_COSTS) for key, nodes in by_recipe.items()}
        assert _flat(dict(kept)) == _flat(rebuilt)
        assert all(
            entry[1] is live[entry[1].node_id]
            for spans in kept.values()
            for by_stop in spans.values()
            for priced in by_stop.values()
            for entry in priced
        )
