"""The relay's bounds as pure decisions: counts and an injected clock, no socket."""

from __future__ import annotations

import pytest

from meshnet.core.errors import InvalidArgument, ResourceExhausted
from meshnet.relay.bounds import ByteBudget, RelayBounds, admit_attach, admit_connection


def test_attachments_stop_at_the_bound_but_a_node_may_replace_its_own() -> None:
    bounds = RelayBounds(max_nodes=2)
    admit_attach(bounds, 1, already_attached=False)
    with pytest.raises(ResourceExhausted, match="--max-nodes 2"):
        admit_attach(bounds, 2, already_attached=False)
    admit_attach(bounds, 2, already_attached=True)


def test_connections_per_node_stop_at_the_bound() -> None:
    bounds = RelayBounds(max_connections_per_node=3)
    admit_connection(bounds, "w-1", 2)
    with pytest.raises(ResourceExhausted, match="w-1 has 3 connections"):
        admit_connection(bounds, "w-1", 3)


def test_the_byte_budget_allows_a_second_of_burst_then_delays_to_the_rate_and_never_refuses() -> None:
    budget = ByteBudget(1000, now=0.0)
    assert budget.take(600, now=0.0) == 0.0
    assert budget.take(400, now=0.0) == 0.0
    assert budget.take(100, now=0.0) == pytest.approx(0.1)  # over the burst: waits, is not refused
    # Debt is shared: a second sender at the same moment waits behind the first one's bytes.
    assert budget.take(100, now=0.0) == pytest.approx(0.2)
    assert budget.take(800, now=0.7) == pytest.approx(0.3)  # 0.7 s paid the debt and 500 bytes of 800
    assert budget.take(1000, now=100.0) == 0.0  # an idle node saves at most one second's worth
    assert budget.take(1, now=100.0) == pytest.approx(0.001)


@pytest.mark.parametrize("field", ["max_nodes", "max_connections_per_node", "bytes_per_s_per_node"])
def test_a_bound_below_one_is_refused(field: str) -> None:
    with pytest.raises(InvalidArgument, match=field.replace("_", " ")):
        RelayBounds(**{field: 0})
