"""Each recipe's routable nodes as the planner reads them (``chain_search.Spans``), kept between replans.

A replan used to index the model's nodes itself, every time: a pass pricing and grouping
thousands of nodes to find the few dozen it labels (issue 36). Here a node is re-entered only
after its planned view changed (a heartbeat, a route through it, a new belief), which between
two replans is the nodes that reported since, not the swarm. Owned by ``tracker.route_index``,
which says which nodes went stale; call from its event loop only.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Mapping

from meshnet.core.ids import NodeId
from meshnet.tracker.chain_search import Spans, own_cost
from meshnet.tracker.route_costs import NodeView, RoutingCosts

_Entry = tuple[float, NodeView]


class SpanIndex:
    """Spans by (fingerprint, n_layers), each node priced with ``costs`` once per view."""

    def __init__(self, costs: RoutingCosts) -> None:
        self._costs = costs
        self._spans: dict[tuple[str, int], dict[int, dict[int, list[_Entry]]]] = {}
        self._entries: dict[NodeId, _Entry] = {}
        self._stale: set[NodeId] = set()

    def stale(self, node_id: NodeId) -> None:
        """``node_id``'s planned view changed or went: re-enter it at the next ``spans``."""
        self._stale.add(node_id)

    def spans(self, planned: Callable[[NodeId], NodeView | None]) -> Mapping[tuple[str, int], Spans]:
        """Every recipe's spans, the stale nodes re-entered first with their view from
        ``planned`` (None: the node is gone)."""
        for node_id in self._stale:
            old = self._entries.pop(node_id, None)
            if old is not None:
                self._remove(node_id, old)
            view = planned(node_id)
            if view is not None:
                entry = (view.cost_ms(self._costs), view)
                self._entries[node_id] = entry
                by_stop = self._spans.setdefault((view.fingerprint, view.n_layers), {})
                insort(by_stop.setdefault(view.layers.start, {}).setdefault(view.layers.stop, []), entry, key=own_cost)
        self._stale.clear()
        return self._spans

    def _remove(self, node_id: NodeId, entry: _Entry) -> None:
        view = entry[1]
        key, start, stop = (view.fingerprint, view.n_layers), view.layers.start, view.layers.stop
        priced = self._spans[key][start][stop]
        index = bisect_left(priced, entry[0], key=own_cost)
        while priced[index][1].node_id != node_id:  # among the entries of equal cost
            index += 1
        del priced[index]
        if not priced:  # the planner reads a span's first entry: none is left empty
            del self._spans[key][start][stop]
            if not self._spans[key][start]:
                del self._spans[key][start]
                if not self._spans[key]:
                    del self._spans[key]
