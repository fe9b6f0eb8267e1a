"""Coverage, gaps and the health verdict over node tables (pure), and their wire form."""

from __future__ import annotations

from status_samples import node, recipe, table

from meshnet.core.layers import LayerRange
from meshnet.core.swarm_status import coverage, judge_health, node_health, runs_where
from meshnet.core.tracking import NodeLoad, PrefixFigures
from meshnet.wire.status_wire import node_table_from_proto, node_table_to_proto


def test_runs_are_maximal_and_half_open() -> None:
    assert runs_where([0, 0, 1, 0, 2, 0], lambda v: v == 0) == (LayerRange(0, 2), LayerRange(3, 4), LayerRange(5, 6))
    assert runs_where([1, 1], lambda v: v == 0) == ()


def test_coverage_counts_each_layer_and_names_the_gaps() -> None:
    (tiny,) = coverage([node("0:2"), node("2:4"), node("2:3"), node("5:6")])
    assert tiny.counts == (1, 1, 2, 1, 0, 1)
    assert tiny.gaps == (LayerRange(4, 5),)
    assert not tiny.complete
    assert tiny.as_json()["gaps"] == [[4, 5]]


def test_coverage_is_per_recipe() -> None:
    # Every node in the table passed the tracker's certification check: each one counts.
    found = coverage([node("0:6"), node("0:6", fingerprint="f2"), node("0:3", fingerprint="f2")])
    by_recipe = {c.fingerprint: c.counts for c in found}
    assert by_recipe == {recipe("f1").fingerprint(): (1,) * 6, recipe("f2").fingerprint(): (2, 2, 2, 1, 1, 1)}


def test_health_is_ok_degraded_or_no_route_with_the_missing_layers() -> None:
    assert judge_health("tiny", table(node("0:3"), node("3:6"))).status == "ok"
    late = judge_health("tiny", table(node("0:3"), node("3:6", beat=0.9)))
    assert late.status == "degraded" and "127.0.0.1:7003" in late.reason
    gap = judge_health("tiny", table(node("0:2"), node("4:6")))
    assert (gap.status, gap.missing_layers) == ("no_route", (LayerRange(2, 4),))
    assert gap.as_json()["missing_layers"] == [[2, 4]]
    assert "layers 2:4" in gap.reason


def test_health_names_what_the_swarm_serves_when_the_model_id_differs() -> None:
    verdict = judge_health("SmolLM2", table(node("0:6", model="tiny")))
    assert verdict.status == "no_route"
    assert verdict.reason == "no certified node serves 'SmolLM2'; the tracker's nodes serve 'tiny'"


def test_an_unreachable_tracker_is_no_route_with_its_reason() -> None:
    verdict = judge_health("tiny", None, "connection refused")
    assert verdict.status == "no_route" and "connection refused" in verdict.reason


def test_a_node_is_late_after_one_and_a_half_intervals() -> None:
    assert node_health(node("0:6", beat=0.75), 0.5) == "healthy"
    assert node_health(node("0:6", beat=0.76), 0.5) == "late"


def test_the_table_survives_the_wire() -> None:
    figures = PrefixFigures(bytes_held=3 << 20, budget_bytes=8 << 20, hits=5, misses=2)
    original = table(node("0:2"), node("2:6", model="other", load=NodeLoad(2, 6, 1, 0.5, prefix=figures)))
    assert node_table_from_proto(node_table_to_proto(original)) == original
