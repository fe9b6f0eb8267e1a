"""The auditor's loop against a simulated swarm: which routes it asks for, whom it blames.

The tracker and the route are simulated (the integration test ``tests/integration/test_audit.py``
runs the real ones): three heads and two tails, a liar among them with a chosen habit. Each
route prefers the liar (it boasts) and otherwise the first node a stage lists.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from meshnet.core.events import RouteHop, TokenGenerated
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import NodeId, RequestId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeCapability
from meshnet.core.tracking import Quarantined, QuarantineOrder, Route
from meshnet.route.audit import AuditCase, AuditConfig, Auditor
from meshnet.route.route_run import RouteSession

HEADS = tuple(NodeId(name) for name in ("h1", "h2", "h3"))
TAILS = tuple(NodeId(name) for name in ("t1", "t2"))
RIGHT, WRONG = (5, 6, 7), (5, 9, 9)
CAPABILITY = NodeCapability(64, 8, 64, 1 << 20, 8, 1)


def _route(*nodes: NodeId) -> Route:
    hops = tuple(RouteHop(node, f"{node}:1", LayerRange(i * 2, i * 2 + 2), CAPABILITY) for i, node in enumerate(nodes))
    return Route(hops=hops, epoch=1, model="m", quantization="Q8_0", fingerprint="rcp-1", n_layers=4, ms_per_token=1)


class Swarm:
    """The tracker and the shards at once: routes around exclusions, tokens by who is on them."""

    def __init__(self, liar: NodeId, lies: Callable[[tuple[int, ...], int], bool]) -> None:
        self.liar = liar
        self.lies = lies
        self.seen: dict[tuple[int, ...], int] = {}
        self.orders: list[QuarantineOrder] = []

    def serve(self, route: Route, request: GenerationRequest) -> tuple[int, ...]:
        """What the route answers; the liar decides by the prompt and how often it saw it."""
        nodes = [hop.node_id for hop in route.hops]
        if self.liar not in nodes:
            return RIGHT
        times = self.seen.get(request.prompt_tokens, 0)
        self.seen[request.prompt_tokens] = times + 1
        return WRONG if self.lies(request.prompt_tokens, times) else RIGHT

    async def choose_route(self, model: str, *, session_id: object, exclude: frozenset[NodeId], **_: object) -> Route:
        stages = [[n for n in stage if n not in exclude] for stage in (HEADS, TAILS)]
        if not all(stages):
            from meshnet.core.errors import NoRoute

            raise NoRoute("no route")
        picks = [self.liar if self.liar in stage else stage[0] for stage in stages]
        return _route(*picks)

    async def quarantine(self, order: QuarantineOrder) -> Quarantined:
        self.orders.append(order)
        return Quarantined(True, order.request_id is not None, 1)

    async def plan(self, session: RouteSession, request: GenerationRequest) -> None:
        return None  # these routes hold no prompt KV

    async def run(
        self, session: RouteSession, request: GenerationRequest, **_: object
    ) -> AsyncIterator[TokenGenerated]:
        route = _route(*(hop.node_id for hop in session.hops))
        for index, token in enumerate(self.serve(route, request)):
            yield TokenGenerated(token, index, 1.0)


def _case(swarm: Swarm, prompt: tuple[int, ...], tail: NodeId) -> AuditCase:
    route = _route(swarm.liar, tail)
    request = GenerationRequest(prompt, 3)
    return AuditCase(RequestId(f"req-{prompt[0]}"), request, route, swarm.serve(route, request))


def _auditor(swarm: Swarm) -> Auditor:
    return Auditor(swarm, swarm, AuditConfig(fraction=1.0, max_delay_s=0))  # type: ignore[arg-type]


async def test_a_liar_that_lies_on_every_request_is_caught_by_one_audit() -> None:
    swarm = Swarm(HEADS[0], lambda prompt, times: True)
    outcome = await _auditor(swarm).audit(_case(swarm, (1, 2), TAILS[0]))
    assert outcome.culprit == HEADS[0] and outcome.verdict.kind == "caught"
    [order] = swarm.orders
    assert order.node_id == HEADS[0] and order.evidence is not None and order.evidence.rule == "one_request"


@pytest.mark.parametrize("tails", [(0, 1), (1, 0)])
async def test_a_liar_honest_on_repeats_is_undecided_alone_and_caught_across_requests(tails: tuple[int, int]) -> None:
    swarm = Swarm(HEADS[0], lambda prompt, times: times == 0)  # lies on first sight only
    auditor = _auditor(swarm)
    first = await auditor.audit(_case(swarm, (1, 2), TAILS[tails[0]]))
    assert first.verdict.kind == "undecided" and first.culprit is None and not swarm.orders
    assert first.verdict.suspects == {HEADS[0], TAILS[tails[0]]}  # never the tail alone
    second = await auditor.audit(_case(swarm, (3, 4), TAILS[tails[1]]))
    assert second.culprit == HEADS[0]
    [order] = swarm.orders
    assert order.evidence is not None and order.evidence.rule == "across_requests"
    assert order.request_id == RequestId("req-3")


async def test_a_liar_always_on_one_route_stays_undecided_and_nobody_is_blamed() -> None:
    swarm = Swarm(HEADS[0], lambda prompt, times: times == 0)
    auditor = _auditor(swarm)
    for prompt in range(1, 6):
        outcome = await auditor.audit(_case(swarm, (prompt, 0), TAILS[0]))
        assert outcome.verdict.kind == "undecided" and outcome.culprit is None
    assert swarm.orders == [] and auditor.counts["undecided"] == 5


async def test_an_honest_swarm_audits_clean() -> None:
    swarm = Swarm(HEADS[0], lambda prompt, times: False)
    auditor = _auditor(swarm)
    for prompt in range(1, 11):
        outcome = await auditor.audit(_case(swarm, (prompt, 0), TAILS[prompt % 2]))
        assert outcome.verdict.clean
    assert swarm.orders == [] and auditor.counts == {"clean": 10}
