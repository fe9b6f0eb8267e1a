"""SuggestLayers' request carries the asking worker's whole cost model, the tied table included."""

from __future__ import annotations

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.core.layer_costs import LayerCosts, LayerQuestion
from meshnet.wire.placement_wire import question_from_proto, question_to_proto


def test_a_question_round_trips_with_every_figure() -> None:
    costs = LayerCosts(
        block_bytes=(3, 4, 5), kv_bytes_per_layer=7, head_bytes=11, tail_bytes=13, fixed_bytes=17, tied_bytes=11
    )
    question = LayerQuestion("smol", costs, budget_bytes=1000)
    assert question_from_proto(question_to_proto(question)) == question


def test_a_tied_share_larger_than_the_head_or_tail_is_refused() -> None:
    message = question_to_proto(LayerQuestion("smol", LayerCosts((3,), 0, head_bytes=2, tail_bytes=9), 100))
    message.tied_bytes = 5
    with pytest.raises(InvalidArgument, match="tied_bytes"):
        question_from_proto(message)
