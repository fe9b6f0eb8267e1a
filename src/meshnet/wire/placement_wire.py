"""SuggestLayers messages <-> ``meshnet.core.layer_costs`` values (both ends use this module).

Kept beside ``tracker_wire`` rather than inside it: it is the one call of the placement feature,
and its request carries a cost model rather than swarm state.
"""

from __future__ import annotations

from meshnet.core.checks import MAX_LAYERS, check_count, check_text
from meshnet.core.errors import InvalidArgument, MeshnetError, Unavailable
from meshnet.core.layer_costs import LayerAdvice, LayerCosts, LayerQuestion
from meshnet.core.layers import LayerRange
from meshnet.wire.generated import tracker_pb2 as pb

MAX_BYTES = 2**50
"""A petabyte: any larger figure is a malformed request, not a model."""


def question_to_proto(question: LayerQuestion) -> pb.LayerSuggestionRequest:
    costs = question.costs
    return pb.LayerSuggestionRequest(
        model=question.model,
        block_bytes=list(costs.block_bytes),
        kv_bytes_per_layer=costs.kv_bytes_per_layer,
        head_bytes=costs.head_bytes,
        tail_bytes=costs.tail_bytes,
        fixed_bytes=costs.fixed_bytes,
        budget_bytes=question.budget_bytes,
        tied_bytes=costs.tied_bytes,
    )


def question_from_proto(message: pb.LayerSuggestionRequest) -> LayerQuestion:
    check_text("model", message.model)
    if not 1 <= len(message.block_bytes) <= MAX_LAYERS:
        raise InvalidArgument(f"block_bytes must list 1..{MAX_LAYERS} layers, got {len(message.block_bytes)}")
    figures = (*message.block_bytes, message.kv_bytes_per_layer, message.head_bytes, message.tail_bytes)
    for value in (*figures, message.fixed_bytes, message.budget_bytes, message.tied_bytes):
        check_count("a byte figure", value, MAX_BYTES)
    if message.tied_bytes > min(message.head_bytes, message.tail_bytes):
        raise InvalidArgument("tied_bytes counts bytes in both head_bytes and tail_bytes: it cannot exceed either")
    costs = LayerCosts(
        block_bytes=tuple(message.block_bytes),
        kv_bytes_per_layer=message.kv_bytes_per_layer,
        head_bytes=message.head_bytes,
        tail_bytes=message.tail_bytes,
        fixed_bytes=message.fixed_bytes,
        tied_bytes=message.tied_bytes,
    )
    return LayerQuestion(message.model, costs, message.budget_bytes)


def advice_to_proto(advice: LayerAdvice) -> pb.LayerSuggestionReply:
    return pb.LayerSuggestionReply(layer_start=advice.layers.start, layer_stop=advice.layers.stop, reason=advice.reason)


def advice_from_proto(message: pb.LayerSuggestionReply, n_layers: int) -> LayerAdvice:
    """The tracker's answer, checked against the asker's model (a bad one is the tracker's fault)."""
    try:
        layers = LayerRange(message.layer_start, message.layer_stop)
        layers.check_within(n_layers)
    except MeshnetError as error:
        raise Unavailable(f"the tracker suggested an impossible range: {error.message}") from None
    return LayerAdvice(layers, message.reason)
