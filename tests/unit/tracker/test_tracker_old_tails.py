"""A mixed-version swarm: a tail that does not advertise a feature a request needs is passed over.

The tracker here is the real registry and planner (``tracker.registry``), the route client's
choice the real ``route.features.capable_route``; an "old" tail is a record without
``NodeCapability.features``, as a node built before issue 35 registers (its protobuf has no
field 15, so the tracker reads an empty list: checked on the wire below).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

import pytest
from tracker_samples import MODEL, registration

from meshnet.core.errors import FeatureUnavailable
from meshnet.core.features import EMBEDDING, LAZY_GRAMMAR, MIN_P, REPETITION_PENALTY, TAIL_FEATURES, needed_features
from meshnet.core.generation import GenerationRequest, SamplingParams
from meshnet.core.ids import NodeId, SessionId
from meshnet.core.node_record import NodeRecord
from meshnet.core.sampling_options import LogitAdjustments, OutputConstraint
from meshnet.core.tracking import Route, RouteQuery
from meshnet.route.features import capable_route
from meshnet.tracker.registry import NodeRegistry
from meshnet.wire.generated import node_pb2 as pb
from meshnet.wire.node_wire import capability_from_proto, capability_to_proto


def _node(registry: NodeRegistry, start: int, rate: float, *, new: bool) -> NodeId:
    """A node over ``start:start+10`` of the sample model; ``new`` advertises this build's features."""
    record = registration(start, start + 10, address=f"n{start}-{rate}:1", decode_tokens_per_s=rate)
    features = TAIL_FEATURES if new else ()
    record = replace(record, capability=replace(record.capability, features=features))
    return registry.register(record, NodeId(f"{'new' if new else 'old'}-{start}-{int(rate)}"))


@pytest.fixture
def registry() -> NodeRegistry:
    return NodeRegistry(clock=lambda: 1000.0, heartbeat_interval_s=2.0, epoch=7, session_ttl_s=60.0)


def _asker(registry: NodeRegistry, session: str) -> Callable[[frozenset[NodeId]], Awaitable[Route]]:
    """The tracker's ChooseRoute for one session, as the route client asks it."""

    async def ask(exclude: frozenset[NodeId]) -> Route:
        return registry.choose_route(RouteQuery(MODEL, SessionId(session), exclude=exclude))

    return ask


async def test_an_old_tail_is_not_chosen_for_a_request_that_needs_a_feature(registry: NodeRegistry) -> None:
    _node(registry, 0, 100.0, new=True)
    old = _node(registry, 10, 900.0, new=False)  # the faster tail: the planner's first choice
    new = _node(registry, 10, 50.0, new=True)
    plain = await capable_route(_asker(registry, "s-plain"), frozenset())
    assert plain.hops[-1].node_id == old  # a request that needs nothing new may take the old tail
    chosen = await capable_route(_asker(registry, "s-min-p"), frozenset({MIN_P}))
    assert chosen.hops[-1].node_id == new


async def test_a_swarm_of_old_tails_refuses_the_request_naming_the_feature(registry: NodeRegistry) -> None:
    _node(registry, 0, 100.0, new=True)
    _node(registry, 10, 900.0, new=False)
    _node(registry, 10, 50.0, new=False)
    with pytest.raises(FeatureUnavailable, match="lazy_grammar") as refused:
        await capable_route(_asker(registry, "s-auto"), frozenset({LAZY_GRAMMAR}))
    assert "older meshnet" in refused.value.message and "2 tail(s)" in refused.value.message


def test_what_a_request_needs() -> None:
    plain = GenerationRequest((1, 2), 4)
    assert needed_features(plain) == frozenset()
    assert needed_features(plain, embedding=True) == {EMBEDDING}
    sampling = SamplingParams(
        temperature=1.0,
        min_p=0.1,
        adjustments=LogitAdjustments(repetition_penalty=1.2),
        constraint=OutputConstraint('root ::= "a"', triggers=("<tool_call>",)),
    )
    assert needed_features(GenerationRequest((1,), 4, sampling)) == {MIN_P, REPETITION_PENALTY, LAZY_GRAMMAR}
    forced = SamplingParams(constraint=OutputConstraint('root ::= "a"'))  # not lazy: every build serves it
    assert needed_features(GenerationRequest((1,), 4, forced)) == frozenset()


def test_features_cross_the_wire_and_an_old_record_has_none() -> None:
    record: NodeRecord = registration(0, 10)
    capability = replace(record.capability, features=TAIL_FEATURES)
    assert capability_from_proto(capability_to_proto(capability)).features == TAIL_FEATURES
    old = capability_to_proto(record.capability)
    old.ClearField("features")  # what a pre-issue-35 node sends: no field 15 at all
    assert capability_from_proto(pb.NodeCapability.FromString(old.SerializeToString())).features == ()
