"""What a tail serves beyond the protocol every node speaks: the features a request may need.

A node that predates a feature ignores its new wire fields instead of refusing them (protobuf
drops what it does not know): an old tail would enforce a lazy grammar from the first token,
turning every ``tool_choice: auto`` reply into a forced call, and would sample without
``min_p`` or the repetition penalty. So each tail advertises the features it serves in its
record (``NodeCapability.features``), and a request that needs one is routed only through a
tail that lists it (``route.features``), or refused with an error naming the feature.
"""

from __future__ import annotations

from meshnet.core.errors import InvalidArgument
from meshnet.core.generation import GenerationRequest

LAZY_GRAMMAR = "lazy_grammar"
"""``OutputConstraint.triggers``: a grammar that holds only once a trigger word is generated."""
MIN_P = "min_p"
REPETITION_PENALTY = "repetition_penalty"
EMBEDDING = "embedding"
"""``StepRequest.embedding``: the tail answers a final chunk with its pooled final-norm row."""

RING_BATCH = "ring_batch"
"""``Shard.RingBatch`` and ``Shard.RingReturnBatch``: the node takes the ring rows of many sessions
in one message, and answers a head's sessions in one message. A sender opens such a stream only
to a node that lists it: rows written to an older node are lost before its UNIMPLEMENTED comes."""

TAIL_FEATURES = tuple(sorted((LAZY_GRAMMAR, MIN_P, REPETITION_PENALTY, EMBEDDING)))
"""What this build's tails serve, sorted."""
NODE_FEATURES = tuple(sorted((*TAIL_FEATURES, RING_BATCH)))
"""What this build's nodes serve, sorted (a node advertises them all)."""

MAX_FEATURES = 64
MAX_FEATURE_CHARS = 64


def check_features(features: tuple[str, ...]) -> None:
    """Sorted, distinct, bounded names; names this build does not know are kept (a newer node's)."""
    if list(features) != sorted(set(features)):
        raise InvalidArgument("a node's features are listed sorted, each once")
    if len(features) > MAX_FEATURES:
        raise InvalidArgument(f"a node lists at most {MAX_FEATURES} features, got {len(features)}")
    if any(not 1 <= len(name) <= MAX_FEATURE_CHARS or not name.isascii() for name in features):
        raise InvalidArgument(f"feature names are 1 to {MAX_FEATURE_CHARS} ASCII characters")


def takes_ring_batches(features: tuple[str, ...]) -> bool:
    """Whether a node whose record lists ``features`` may be sent ring batches (``RING_BATCH``)."""
    return RING_BATCH in features


def needed_features(request: GenerationRequest, *, embedding: bool = False) -> frozenset[str]:
    """The features a tail must serve for ``request`` to be served as asked."""
    sampling = request.sampling
    needed = set()
    if embedding:
        needed.add(EMBEDDING)
    if sampling.min_p > 0.0:
        needed.add(MIN_P)
    if sampling.adjustments.repetition_penalty != 1.0:
        needed.add(REPETITION_PENALTY)
    if sampling.constraint is not None and sampling.constraint.triggers:
        needed.add(LAZY_GRAMMAR)
    return frozenset(needed)
