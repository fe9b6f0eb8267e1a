"""An embedding session on the wire: the opening frame's EmbeddingSpec and the tail's vector
round-trip exactly (float64, every bit), and a hostile sender's spec or vector is refused."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from protocol_samples import decode_bytes, token_frame

from meshnet.core.embedding import EmbeddingSpec
from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import SessionId
from meshnet.wire.embedding_wire import MAX_EMBEDDING_VALUES
from meshnet.wire.frames import StepResult
from meshnet.wire.generated import shard_pb2 as pb
from meshnet.wire.shard_wire import frame_to_proto, result_from_proto, result_to_proto


@pytest.mark.parametrize("normalize", [True, False])
def test_the_opening_frame_carries_the_spec(normalize: bool) -> None:
    frame = replace(token_frame(), embedding=EmbeddingSpec(normalize=normalize))
    back = decode_bytes(frame_to_proto(frame).SerializeToString())
    assert back.embedding == EmbeddingSpec("last", normalize)
    assert decode_bytes(frame_to_proto(token_frame()).SerializeToString()).embedding is None


def test_the_vector_keeps_every_float64_bit() -> None:
    vector = tuple(np.random.default_rng(3).standard_normal(64).tolist())
    result = StepResult(SessionId("s-1"), step=2, next_position=9, token_id=None, embedding=vector)
    back = result_from_proto(pb.StepResponse.FromString(result_to_proto(result).SerializeToString()))
    assert back == result and back.embedding == vector


def test_a_pooling_not_served_is_refused() -> None:
    message = frame_to_proto(replace(token_frame(), embedding=EmbeddingSpec()))
    message.embedding.pooling = "mean"
    with pytest.raises(InvalidArgument, match="not served"):
        decode_bytes(message.SerializeToString())


def test_only_an_opening_frame_asks_for_an_embedding() -> None:
    later = token_frame(opening=False, cache="continue", step=1, position=3)
    with pytest.raises(InvalidArgument, match="opening frame asks for an embedding"):
        replace(later, ring=True, embedding=EmbeddingSpec())


@pytest.mark.parametrize(
    ("values", "match"),
    [([], "1.."), ([0.0] * (MAX_EMBEDDING_VALUES + 1), "1.."), ([1.0, float("nan")], "not finite")],
    ids=["empty", "too-long", "nan"],
)
def test_a_hostile_vector_is_refused(values: list[float], match: str) -> None:
    message = pb.StepResponse(session_id="s-1", step=1, next_position=4)
    message.embedding.values.extend(values)
    message.embedding.SetInParent()
    with pytest.raises(InvalidArgument, match=match):
        result_from_proto(message)


def test_an_answer_is_a_token_or_a_vector_never_both() -> None:
    with pytest.raises(InvalidArgument, match="no token"):
        StepResult(SessionId("s-1"), step=1, next_position=4, token_id=7, embedding=(1.0,))
