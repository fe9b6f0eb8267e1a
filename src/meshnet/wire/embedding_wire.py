"""shard.proto's EmbeddingSpec / EmbeddingVector <-> ``core.embedding`` values (``shard_wire`` uses them).

Decoding never trusts the sender: the pooling is one meshnet serves, and a vector is bounded in
length and finite before anything reads it.
"""

from __future__ import annotations

import math

from meshnet.core.embedding import EmbeddingSpec, pooling_kind
from meshnet.core.errors import InvalidArgument
from meshnet.wire.generated import shard_pb2 as pb

MAX_EMBEDDING_VALUES = 1 << 16
"""More values than any model's ``n_embd``: a longer vector is refused before it is copied."""


def embedding_spec_to_proto(spec: EmbeddingSpec) -> pb.EmbeddingSpec:
    return pb.EmbeddingSpec(pooling=spec.pooling, normalize=spec.normalize)


def embedding_spec_from_proto(message: pb.EmbeddingSpec) -> EmbeddingSpec:
    return EmbeddingSpec(pooling_kind(message.pooling), message.normalize)


def vector_to_proto(values: tuple[float, ...]) -> pb.EmbeddingVector:
    return pb.EmbeddingVector(values=values)


def vector_from_proto(message: pb.EmbeddingVector) -> tuple[float, ...]:
    values = message.values
    if not 0 < len(values) <= MAX_EMBEDDING_VALUES:
        raise InvalidArgument(f"an embedding holds 1..{MAX_EMBEDDING_VALUES} values, got {len(values)}")
    vector = tuple(values)
    if not all(math.isfinite(value) for value in vector):
        raise InvalidArgument("the embedding holds a value that is not finite")
    return vector
