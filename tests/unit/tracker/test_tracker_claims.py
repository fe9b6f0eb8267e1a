"""A node's self-declared speed is believed only as far as its peers' claims make plausible."""

from __future__ import annotations

from dataclasses import replace

from tracker_samples import MODEL, OTHER_RECIPE, RECIPE, view

from meshnet.core.recipe import Recipe
from meshnet.tracker.claims import credible_views
from meshnet.tracker.route_costs import NodeView
from meshnet.tracker.routing import choose_model_route

SIX_LAYERS = replace(RECIPE, n_layers=6)


def node(node_id: str, start: int, stop: int, rate: float, recipe: Recipe = SIX_LAYERS) -> NodeView:
    return view(node_id, start, stop, rate=rate, recipe=recipe)


def test_an_outlandish_claim_counts_as_the_lower_median() -> None:
    honest = [node("a", 0, 3, 100.0), node("b", 3, 6, 100.0)]
    liar = node("rogue", 3, 6, 1e9)
    believed = {v.node_id: v.decode_tokens_per_s for v in credible_views([*honest, liar])}
    assert believed["rogue"] == 100.0
    assert believed["a"] == believed["b"] == 100.0


def test_the_liar_no_longer_wins_the_route() -> None:
    views = credible_views([node("a", 0, 3, 100.0), node("b", 3, 6, 120.0), node("rogue", 3, 6, 1e9)])
    plan = choose_model_route(views, MODEL)
    assert "rogue" not in {hop.node_id for hop in plan.hops}


def test_plausible_differences_and_lone_nodes_are_believed() -> None:
    views = [
        node("a", 0, 3, 100.0),
        node("b", 3, 6, 2500.0),
        node("solo", 0, 6, 1e6, recipe=replace(OTHER_RECIPE, n_layers=6)),
    ]
    assert [v.decode_tokens_per_s for v in credible_views(views)] == [100.0, 2500.0, 1e6]


def test_claims_are_compared_per_layer() -> None:
    # 20 tok/s over 6 layers is the same per-layer speed as 60 tok/s over 2: both are believed.
    views = [node("whole", 0, 6, 20.0), node("part", 0, 2, 60.0)]
    assert [v.decode_tokens_per_s for v in credible_views(views)] == [20.0, 60.0]
