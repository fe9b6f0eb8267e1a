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


def test_the_byte_budget_allows_a_second_of_burst_then_the_rate() -> None:
    budget = ByteBudget(1000, now=0.0)
    budget.spend("w-1", 600, now=0.0)
    budget.spend("w-1", 400, now=0.0)
    with pytest.raises(ResourceExhausted, match="--max-bytes-per-s 1000"):
        budget.spend("w-1", 1, now=0.0)
    budget.spend("w-1", 500, now=0.5)  # half a second refills half the rate
    with pytest.raises(ResourceExhausted):
        budget.spend("w-1", 501, now=1.0)
    budget.spend("w-1", 1000, now=100.0)  # an idle node saves at most one second's worth
    with pytest.raises(ResourceExhausted):
        budget.spend("w-1", 1, now=100.0)


@pytest.mark.parametrize("field", ["max_nodes", "max_connections_per_node", "bytes_per_s_per_node"])
def test_a_bound_below_one_is_refused(field: str) -> None:
    with pytest.raises(InvalidArgument, match=field.replace("_", " ")):
        RelayBounds(**{field: 0})
