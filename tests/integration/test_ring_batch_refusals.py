"""A ring row the next hop refuses fails its session at once, not at the step's deadline.

The tail here is ``refusing_worker.py``: a real worker whose RingBatch handler, from step 6 on,
refuses every row (as a worker refuses a row of a session it does not hold) or breaks the batch
stream with the row unanswered, while each session's own stream stays open: nothing but the
batch stream tells the sender that its row went nowhere.
Two routes share that tail: on one the head sends it the rows, on the other a middle does. Each
request has a 10-minute deadline, far past the test's own bound: each session must end with the
refusal's typed error (``Unavailable``, ``worker_lost``: the client fails over as on a lost hop),
not the driver's step budget (``StepTimedOut``, what it ended with before), and its tokens until
then equal the in-process chain of the same fake shards (the oracle). The head's session ends
with the refusal (or the break) itself; the middle's failure ends the session on the tail as
well, whose end of the ring may reach the head first, so there the middle's log shows what it
acted on.

The workers run the fake backend (``worker_harness``'s default): real processes, gRPC, engine loops
and batching, without llama.cpp.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from worker_harness import (
    RunningWorker,
    WorkerCluster,
    fake_reference,
    fake_specs,
    greedy_request,
    new_driver,
    route_session,
)

from meshnet.core.errors import StepTimedOut, Unavailable
from meshnet.core.events import TokenGenerated
from meshnet.core.features import RING_BATCH
from meshnet.core.generation import GenerationRequest
from meshnet.route.route_run import RouteSession
from meshnet.route.shard_stream import ChannelPool

pytestmark = pytest.mark.timeout(120)

LONG_DEADLINE_S = 600.0
"""The request's deadline, and with it each step's: far past this test's bound (``wait_for``)."""
REFUSAL = "refused the session's ring row of step 6: refused by the test's refusing worker"


def refusing(mode: str) -> tuple[str, ...]:
    return (sys.executable, str(Path(__file__).with_name("refusing_worker.py")), mode)


@dataclass
class TwoRoutes:
    """A route whose head sends the tail its rows, and one whose middle does, run at once."""

    sessions: list[RouteSession]
    expected: list[list[int]]
    """Each route's tokens from the in-process chain of the same fake shards (the oracle)."""
    produced: list[list[int]] = field(default_factory=lambda: [[], []])

    async def run(self, pool: ChannelPool, request: GenerationRequest) -> list[BaseException | None]:
        driver = new_driver(pool)

        async def one(index: int) -> None:
            async for event in driver.run(self.sessions[index], request):
                if isinstance(event, TokenGenerated):
                    self.produced[index].append(event.token_id)

        return await asyncio.wait_for(asyncio.gather(one(0), one(1), return_exceptions=True), timeout=60)


async def two_routes(
    cluster: WorkerCluster, pool: ChannelPool, mode: str, request: GenerationRequest
) -> tuple[TwoRoutes, RunningWorker, RunningWorker]:
    """Both routes through one ``refusing_worker.py`` tail of ``mode``; also its middle and tail."""
    head, short_head, middle = cluster.start(*fake_specs([(0, 3), (0, 2), (2, 3)]))
    (tail,) = cluster.start(*fake_specs([(3, 6)]), program=refusing(mode))
    routes = [[head, tail], [short_head, middle, tail]]
    expected = [fake_reference([w.layers for w in route], request) for route in routes]
    sessions = [await route_session(pool, route) for route in routes]
    return TwoRoutes(sessions, expected), middle, tail


@pytest.mark.parametrize("mode", ["refuse", "break"])
async def test_a_refused_or_lost_row_fails_its_session_at_once_from_a_head_and_from_a_middle(
    tmp_path: Path, pool: ChannelPool, mode: str
) -> None:
    request = greedy_request([5, 9, 2, 7], 1_500, timeout_s=LONG_DEADLINE_S)
    with WorkerCluster(tmp_path) as cluster:
        routes, middle, tail = await two_routes(cluster, pool, mode, request)
        assert all(RING_BATCH in hop.capability.features for s in routes.sessions for hop in s.hops)
        outcomes = await routes.run(pool, request)
        middle_log = middle.log_path.read_text()

    for index, outcome in enumerate(outcomes):
        assert isinstance(outcome, Unavailable) and not isinstance(outcome, StepTimedOut), outcome
        assert outcome.code == "worker_lost"
        produced = routes.produced[index]
        assert 0 < len(produced) < 10
        assert produced == routes.expected[index][: len(produced)]
    head_outcome = outcomes[0]
    assert isinstance(head_outcome, Unavailable)
    if mode == "refuse":
        assert REFUSAL in head_outcome.message, head_outcome
        assert f"{REFUSAL} (session {routes.sessions[1].session_id})" in middle_log
    else:
        broke = f"the ring batch stream to {tail.address} broke"
        assert broke in head_outcome.message and "row unanswered" in head_outcome.message, head_outcome
        assert broke in middle_log


async def test_an_older_tail_gets_per_session_streams_from_the_first_row(tmp_path: Path, pool: ChannelPool) -> None:
    # A tail from before ring batches lists no ``ring_batch`` and answers UNIMPLEMENTED: its
    # upstreams (a head, a middle) must never write a batch to it, or those rows are lost.
    request = greedy_request([5, 9, 2, 7], 24, timeout_s=LONG_DEADLINE_S)
    with WorkerCluster(tmp_path) as cluster:
        routes, _, _ = await two_routes(cluster, pool, "old", request)
        assert RING_BATCH not in routes.sessions[0].hops[-1].capability.features
        assert [h.ring_batch for h in routes.sessions[1].downstream()] == [True, False]
        outcomes = await routes.run(pool, request)

    assert outcomes == [None, None]
    assert routes.produced == routes.expected
