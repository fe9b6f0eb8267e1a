"""A failover reopens a session under its id on a newer route: a shard kept on the new route that
still holds the lost route's session (nothing reached it over a link that went down) gives it up
to the newer route, and the lost route's stream, when it finally ends, frees nothing of the new one.

The tail here runs ``FakeBackend`` (``worker_shards``): it shows the session bookkeeping, not
llama.cpp numerics; tests/model/test_lab_real.py takes a real link down in the lab and checks the
failover's output against the whole model.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest
from worker_shards import FINGERPRINT, Route, start_route

from meshnet.core.errors import PermissionDenied, RouteStale, TicketRefused
from meshnet.core.generation import SamplingParams
from meshnet.core.ids import RequestId, SessionId
from meshnet.core.tickets import CLOCK_SKEW_S, SealedTicket
from meshnet.core.tracking import SessionTokens
from meshnet.node.servicer import ShardServicer
from meshnet.node.session_stream import SessionStream
from meshnet.wire.frames import FrameMeta, StepFrame

SESSION = SessionId("s-takeover")
ROWS = 3


@pytest.fixture
async def route() -> AsyncIterator[Route]:
    started = await start_route(((0, 3), (3, 6)))
    yield started
    await started.close()


def tail_frame(
    route: Route, epoch: int, *, step: int = 0, position: int = 0, rows: int = ROWS, ticket: SealedTicket | None = None
) -> StepFrame:
    """A frame into the tail as a middle forwards it: the opening one down the chain, later ones
    on the ring."""
    tail = route.shards[1]
    opening = step == 0
    meta = FrameMeta(
        RequestId("r-takeover"),
        SESSION,
        epoch,
        FINGERPRINT,
        tail.shape.layers,
        "prefill" if opening else "decode",
        position,
        step,
        "new" if opening else "continue",
        deadline_ms=5000,
    )
    hidden = np.full((rows, tail.shape.n_embd), 0.25 * (position + 1), np.float32)
    if opening and ticket is None:
        ticket = route.ticket(SESSION, epoch=epoch)
    return StepFrame(
        meta,
        hidden=hidden,
        sampling=SamplingParams() if opening else None,
        final_chunk=True,
        ring=not opening,
        ticket=ticket if opening else None,
    )


async def test_a_newer_route_takes_the_session_over_and_the_lost_streams_end_frees_nothing_of_it(
    route: Route,
) -> None:
    tail = route.shards[1]
    lost = SessionStream(tail, None)
    first = await lost.run(tail_frame(route, epoch=1))
    replacement = SessionStream(tail, None)
    again = await replacement.run(tail_frame(route, epoch=2))
    assert again.token_id == first.token_id and tail.open_sessions == 1
    await lost.end(None)  # the lost route's stream ends at last: the session is the new route's now
    assert tail.open_sessions == 1
    await replacement.run(tail_frame(route, epoch=2, step=1, position=ROWS, rows=1))
    await replacement.end(None)
    assert tail.open_sessions == 0


@pytest.mark.parametrize("wrong", ["older epoch", "another session", "expired"])
async def test_a_newer_opening_without_its_own_routes_ticket_takes_nothing_over(route: Route, wrong: str) -> None:
    tail = route.shards[1]
    held = SessionStream(tail, None)
    first = await held.run(tail_frame(route, epoch=1))
    tickets = {
        "older epoch": route.ticket(SESSION, epoch=1),
        "another session": route.ticket("s-other", epoch=2),
        "expired": route.ticket(SESSION, epoch=2, seconds=1.0, age_s=CLOCK_SKEW_S + 2),
    }
    with pytest.raises(TicketRefused):
        await SessionStream(tail, None).run(tail_frame(route, epoch=2, ticket=tickets[wrong]))
    assert tail.open_sessions == 1  # the held session is still the first route's
    again = await held.run(tail_frame(route, epoch=1, step=1, position=ROWS, rows=1))
    assert again.token_id is not None and first.token_id is not None
    await held.end(None)


async def test_an_older_or_repeated_opening_takes_nothing_over(route: Route) -> None:
    tail = route.shards[1]
    held = SessionStream(tail, None)
    first = await held.run(tail_frame(route, epoch=2))
    with pytest.raises(RouteStale):
        await SessionStream(tail, None).run(tail_frame(route, epoch=1))
    repeated = await SessionStream(tail, None).run(tail_frame(route, epoch=2))
    assert repeated == first  # answered again, not run again
    assert tail.open_sessions == 1
    await held.end(None)


def test_only_a_newer_route_may_open_another_partys_session_again(route: Route) -> None:
    servicer = ShardServicer(route.shards[1], None)
    servicer._openers[SESSION] = ("w-a", 2)
    with pytest.raises(PermissionDenied):
        servicer._check_owner(SESSION, 2, "w-b")
    servicer._check_owner(SESSION, 3, "w-b")  # the failover's new route
    servicer._check_owner(SESSION, 2, "w-a")  # the opener itself, repeating its opening frame


async def test_each_routes_session_is_counted_for_the_tracker_when_it_ends(route: Route) -> None:
    """What the tracker holds work records to (``node.session_counts``): positions filled and
    where sampling began, per route epoch, queued once the session leaves the shard."""
    tail = route.shards[1]
    lost = SessionStream(tail, None)
    await lost.run(tail_frame(route, epoch=1))
    assert tail.counts.take() == ()  # nothing ended yet
    replacement = SessionStream(tail, None)
    await replacement.run(tail_frame(route, epoch=2))  # takes the session over: epoch 1's ends
    await replacement.run(tail_frame(route, epoch=2, step=1, position=ROWS, rows=1))
    await replacement.end(None)
    assert tail.counts.take() == (
        SessionTokens(SESSION, 1, ROWS, ROWS),
        SessionTokens(SESSION, 2, ROWS + 1, ROWS),
    )
    assert not tail.counts.ready.is_set()
    tail.counts.put_back((SessionTokens(SESSION, 2, ROWS + 1, ROWS),))  # a report that failed: sent again
    assert tail.counts.ready.is_set() and tail.counts.take() == (SessionTokens(SESSION, 2, ROWS + 1, ROWS),)
