"""Bounded peers on a shard (issue 29, finding 4): the opener a stream's certificate names reaches
the session table, an opener at its bound is refused naming it, and a slot taken back from an
opener over its share ends that session's stream with a cache miss (its KV freed, its state
released). The real swarm with certificates is tests/integration/test_bounded_peers.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest
from worker_shards import FINGERPRINT, Route, admission_policy, start_route

from meshnet.core.errors import CacheMiss, ResourceExhausted
from meshnet.core.generation import SamplingParams
from meshnet.core.ids import RequestId, SessionId
from meshnet.node.session_stream import SessionStream
from meshnet.session.admission import PeerBounds
from meshnet.wire.frames import FrameMeta, StepFrame

ROWS = 3
PEERS = PeerBounds(share=0.5, min_token_rate=0.5, grace=60.0)


@pytest.fixture
async def route() -> AsyncIterator[Route]:
    started = await start_route(((0, 3), (3, 6)), policy=admission_policy(2, evict_idle_after=600.0, peers=PEERS))
    yield started
    await started.close()


def tail_frame(route: Route, session: str, *, step: int = 0) -> StepFrame:
    """A frame into the tail as an upstream worker sends it (the opening one, then ring steps)."""
    tail = route.shards[1]
    opening = step == 0
    position = 0 if opening else ROWS + step - 1
    meta = FrameMeta(
        RequestId(f"r-{session}"),
        SessionId(session),
        0,
        FINGERPRINT,
        tail.shape.layers,
        "prefill" if opening else "decode",
        position,
        step,
        "new" if opening else "continue",
    )
    hidden = np.full((ROWS if opening else 1, tail.shape.n_embd), 0.5, np.float32)
    return StepFrame(meta, hidden=hidden, sampling=SamplingParams() if opening else None, ring=not opening)


async def test_an_opener_over_its_share_is_refused_at_its_bound_and_gives_a_slot_back(route: Route) -> None:
    tail = route.shards[1]
    squatted = [SessionStream(tail, None, "w-squatter") for _ in range(2)]
    for index, stream in enumerate(squatted):
        await stream.run(tail_frame(route, f"s{index}"))  # both free slots: past its share of 1
    with pytest.raises(ResourceExhausted, match="2 by this peer: at or over its bound of 1"):
        await SessionStream(tail, None, "w-squatter").run(tail_frame(route, "s2"))
    await squatted[1].run(tail_frame(route, "s1", step=1))  # s0 is now its least recently used
    user = SessionStream(tail, None, "w-upstream")
    await user.run(tail_frame(route, "u0"))
    assert tail.open_sessions == 2 and tail.metrics().evictions == 1
    with pytest.raises(CacheMiss, match="evicted"):
        await squatted[0].run(tail_frame(route, "s0", step=1))
    await squatted[1].run(tail_frame(route, "s1", step=2))  # at its share now: kept
    for stream in (*squatted, user):
        await stream.end(None)
    assert tail.open_sessions == 0
