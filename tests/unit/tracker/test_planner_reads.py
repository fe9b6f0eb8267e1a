"""A replan reads each node's facts once per view, and what it remembers is what it would compute.

A 3,000-node replan is one uninterrupted stretch of the tracker's event loop (issue 36: it
was the largest Python cost on the loop at 3,000 nodes and 100 routes/s, and the longest
callbacks); most of it was reading the same record facts again and again through properties,
and pricing every node again though most views outlive many replans. These tests pin that
work down and check the remembered values against the functions they stand for.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from tracker_samples import view

from meshnet.core.ids import NodeId
from meshnet.tracker.route_costs import DEFAULT_COSTS, NodeView, node_cost_ms
from meshnet.tracker.route_index import IndexedLatencies
from meshnet.tracker.routing import choose_model_route

FACTS = ("fingerprint", "model", "n_layers")


class CountingRecord:
    """A node's record that counts reads of the facts the planner filters on (a stand-in: it
    answers every other attribute from the real record, uncounted)."""

    def __init__(self, record: Any, reads: Counter[str]) -> None:
        self._record = record
        self._reads = reads

    def __getattr__(self, name: str) -> Any:
        if name in FACTS:
            self._reads[name] += 1
        return getattr(self._record, name)


def _swarm(reads: Counter[str]) -> list[NodeView]:
    spans = [(0, 10), (0, 5), (5, 10), (10, 20), (10, 15), (15, 20), (0, 20)]
    nodes = [view(f"n{index}", start, stop, rate=50.0 + index) for index, (start, stop) in enumerate(spans)]
    return [replace(node, record=CountingRecord(node.record, reads)) for node in nodes]  # type: ignore[arg-type]


def test_replanning_the_same_views_reads_each_fact_of_a_node_once() -> None:
    reads: Counter[str] = Counter()
    nodes = _swarm(reads)
    first = choose_model_route(nodes, nodes[0].model)
    reads.clear()
    for _ in range(3):
        assert choose_model_route(nodes, nodes[0].model) == first
    # The views remember what the first plan read; each plan reads only its own model name,
    # once, from its first hop's record.
    assert reads == Counter({"model": 3})


def test_a_first_plan_reads_each_fact_of_a_node_once() -> None:
    reads: Counter[str] = Counter()
    nodes = _swarm(reads)
    choose_model_route(nodes, nodes[0].model)
    # Once per view, and the plan's model name once more (from its first hop's record).
    assert reads == Counter({"fingerprint": len(nodes), "n_layers": len(nodes), "model": len(nodes) + 1})


def test_a_remembered_cost_is_the_cost_for_the_costs_asked() -> None:
    node = view("n0", 0, 20, rate=0.0, free_sessions=0, queue_depth=2)
    dearer = replace(DEFAULT_COSTS, full_node_penalty_ms=DEFAULT_COSTS.full_node_penalty_ms * 3)
    for costs in (DEFAULT_COSTS, dearer, DEFAULT_COSTS, dearer):
        assert node.cost_ms(costs) == node_cost_ms(node, costs)
    assert node.cost_ms(DEFAULT_COSTS) != node.cost_ms(dearer)
    # A new view of the node (its next heartbeat) prices its own load, not the old view's.
    emptier = replace(node, free_sessions=3, queue_depth=0)
    assert emptier.cost_ms(DEFAULT_COSTS) == node_cost_ms(emptier, DEFAULT_COSTS) < node.cost_ms(DEFAULT_COSTS)


def test_reported_rows_are_each_nodes_report() -> None:
    latency = IndexedLatencies()
    latency.set_row(NodeId("a"), [("b.local:9000", 4.0), ("c.local:9000", 6.0)])
    latency.set_row(NodeId("b"), [("a.local:9000", 2.0)])
    latency.set_row(NodeId("b"), [("c.local:9000", 8.0)])  # replaced whole
    nodes = [NodeId("a"), NodeId("b"), NodeId("silent")]
    rows = latency.reported_rows(nodes)
    assert list(rows) == nodes
    for node_id in nodes:
        assert rows[node_id] == latency.reported(node_id)
        assert rows[node_id] is latency.reported(node_id)  # not copied: rows are replaced, never changed
