"""A late refusal of a session's old leg never fails the leg that reopened the session.

A session id can be opened again on a forwarding shard (a failover's newer route, a retry): its
new leg sends its rows on the same RingBatch stream as the old one did, and takes the old leg's
place as the session's sender there. A refusal of the old leg's row that arrives after that must
not fail the new leg, even with the steps lined up (it did, before each row named its leg's
incarnation and each refusal echoed it).

Sender side (the first test): the real ``BatchLink`` of a worker writes to a next hop over real
gRPC on loopback; the next hop is a scripted RingBatch server in this process, so that the late
refusal comes deterministically after the new leg's row. It then breaks the stream: that must
fail the new leg, whose row it leaves unanswered, with the break and not the old leg's refusal.
The legs are real ``RingLeg``s over downstream links that stay open (as a middle's: no tail
answers are read, so nothing but the batch stream ends them). A peer from before incarnations
echoes none (0): then the refusal fails the session's last sender, as it always did.

Receiver side: a real worker process echoes each refused row's incarnation, and refuses a late
row of an earlier opening (another route epoch) instead of handing it to the session reopened
under its id, which it would end (``RouteStale``): that session finishes equal to the in-process
chain of the same fake shards (the oracle). The workers run the fake backend (real processes,
gRPC, engine loops and batching, without llama.cpp).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import grpc.aio
import numpy as np
import pytest
from worker_harness import (
    FAKE,
    WorkerCluster,
    fake_reference,
    fake_specs,
    greedy_request,
    new_driver,
    route_session,
)

from meshnet.core.errors import MeshnetError
from meshnet.core.events import TokenGenerated
from meshnet.core.ids import LegIncarnation, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.node.ring import RingLeg, watch_error
from meshnet.route.coalescer import SeamCount
from meshnet.route.ring_batch import BatchLink
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire import services
from meshnet.wire.batch_frames import RefusedRow
from meshnet.wire.batch_wire import batch_to_proto, refused_from_proto, refused_to_proto, row_incarnation
from meshnet.wire.frames import FrameMeta, StepFrame, StepResult

pytestmark = pytest.mark.timeout(60)

REOPENED, WITNESS = "s-reopened", "s-witness"
STEP = 6
LATE = "a late refusal of the old leg's row"
BROKE = "the scripted next hop breaks the batch stream"


TAIL_LAYERS = LayerRange(3, 6)


def ring_row(
    session: str, step: int, layers: LayerRange = TAIL_LAYERS, fingerprint: str = "rcp-1", epoch: int = 0
) -> StepFrame:
    meta = FrameMeta(
        request_id=RequestId("req-1"),
        session_id=SessionId(session),
        route_epoch=epoch,
        fingerprint=fingerprint,
        layers=layers,
        phase="decode",
        position=100 + step,
        step=step,
        cache="continue",
    )
    return StepFrame(meta, hidden=np.ones((1, FAKE.n_embd), np.float32), ring=True)


class ScriptedNextHop(services.ShardServicer):
    """Takes two batches, then refuses the first row (the old leg's) and the witness's row in one
    ack, echoing their incarnations (0 as an older receiver), then breaks the stream."""

    def __init__(self, echoes: bool) -> None:
        self._echoes = echoes

    async def RingBatch(
        self, request_iterator: AsyncIterator[services.StepBatch], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[services.BatchAck]:
        rows: list[services.StepRequest] = []
        async for batch in request_iterator:
            rows.extend(batch.rows)
            if len(rows) == 3:  # the old leg's row; the new leg's and the witness's
                old, _, witness = rows
                yield refused_to_proto([self._refusal(old, LATE), self._refusal(witness, "the witness's row")])
                await context.abort(grpc.StatusCode.UNAVAILABLE, BROKE)

    def _refusal(self, row: services.StepRequest, reason: str) -> RefusedRow:
        incarnation = row_incarnation(row) if self._echoes else LegIncarnation(0)
        return RefusedRow(row.header.session_id, row.header.step, reason, incarnation)


class OpenLink:
    """A downstream Session stream that stays open: only the batch stream can end the leg."""

    async def send(self, frame: StepFrame) -> None:
        raise AssertionError("rows go in batches in this test")

    async def read(self) -> StepResult:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def finish_writing(self) -> None:
        return None

    def cancel(self) -> None:
        return None


@pytest.fixture
async def scripted(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    server = grpc.aio.server()
    services.add_shard_servicer(ScriptedNextHop(echoes=request.param), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


def started(step: int) -> RingLeg:
    leg = RingLeg()
    leg.start(OpenLink())
    leg.batched_step = step  # as ``ForwardStage._forward`` sets it before it sends the row
    return leg


async def ended(leg: RingLeg) -> MeshnetError:
    assert leg.watch is not None
    await asyncio.wait({leg.watch})
    return watch_error(leg.watch)


async def reopened_on_one_stream(address: str, pool: ChannelPool) -> tuple[RingLeg, RingLeg]:
    """The new leg and the witness, once the old leg, the new one and the witness each sent a row
    on one batch stream to ``address`` and the scripted next hop ended it."""
    link = BatchLink(pool, address, None, SeamCount())
    old, new, witness = started(STEP), started(STEP), started(STEP)
    assert old.incarnation != new.incarnation
    try:
        await link.send(ring_row(REOPENED, STEP), old)
        # The session is opened again under the same id; its new leg's row, of the same step,
        # goes on the same stream before the old row's refusal comes back.
        await link.send(ring_row(REOPENED, STEP), new)
        await link.send(ring_row(WITNESS, STEP), witness)
        await ended(new)
        await ended(witness)
    finally:
        await link.close()
    return new, witness


@pytest.mark.parametrize("scripted", [True], indirect=True)
async def test_a_late_refusal_of_the_old_leg_does_not_fail_the_reopened_session(
    scripted: str, pool: ChannelPool
) -> None:
    new, witness = await reopened_on_one_stream(scripted, pool)
    witness_error, new_error = await ended(witness), await ended(new)

    assert "the witness's row" in witness_error.message  # the refusals reached this worker
    # The stream broke after the late refusal, with the new leg's row unanswered: that, and only
    # that, ends the new leg.
    assert LATE not in new_error.message, new_error
    assert "broke" in new_error.message and "row unanswered" in new_error.message, new_error


@pytest.mark.parametrize("scripted", [False], indirect=True)
async def test_a_refusal_from_an_older_next_hop_fails_the_sessions_last_sender_as_before(
    scripted: str, pool: ChannelPool
) -> None:
    new, _ = await reopened_on_one_stream(scripted, pool)
    new_error = await ended(new)
    assert LATE in new_error.message, new_error  # nothing says whose row it was: the step decides


@pytest.fixture
def tail(tmp_path: Path) -> Iterator[tuple[str, LayerRange, str]]:
    with WorkerCluster(tmp_path) as cluster:
        (worker,) = cluster.start(*fake_specs([(3, 6)]))
        yield worker.address, worker.layers, worker.fingerprint


async def test_a_worker_echoes_the_incarnation_of_each_row_it_refuses(
    tail: tuple[str, LayerRange, str], pool: ChannelPool
) -> None:
    address, layers, fingerprint = tail
    first, second = LegIncarnation(2**64 - 1), LegIncarnation(41)
    rows = [(ring_row("nobody-opened-this", STEP, layers, fingerprint), i) for i in (first, second)]
    call = pool.stub(address).RingBatch()
    await call.write(batch_to_proto(rows))
    refused = refused_from_proto(await call.read())
    call.cancel()

    assert [(r.session_id, r.step, r.incarnation) for r in refused] == [
        ("nobody-opened-this", STEP, first),
        ("nobody-opened-this", STEP, second),
    ]


async def test_a_late_row_of_an_earlier_opening_is_refused_and_the_reopened_session_runs_on(
    tmp_path: Path, pool: ChannelPool
) -> None:
    request = greedy_request([5, 9, 2, 7], 200)
    strike_after, old_incarnation = 5, LegIncarnation(77)
    with WorkerCluster(tmp_path) as cluster:
        route = cluster.start(*fake_specs([(0, 3), (3, 6)], step_delay=0.01))
        expected = fake_reference([w.layers for w in route], request)
        # The session as a failover's newer route reopened it (epoch 2); its epoch-1 opening's
        # leg had a row of step 8 on its way (a decode row, checksum and all, only late).
        session = await route_session(pool, route, epoch=2)
        tail = route[-1]
        late = ring_row(session.session_id, 8, tail.layers, tail.fingerprint, epoch=1)
        produced: list[int] = []
        call = pool.stub(tail.address).RingBatch()
        try:
            async for event in new_driver(pool).run(session, request):
                if isinstance(event, TokenGenerated):
                    produced.append(event.token_id)
                    if len(produced) == strike_after:  # mid-decode: the session is held on the tail
                        await call.write(batch_to_proto([(late, old_incarnation)]))
            # Handed to the session instead, the row would have ended it (the run above raises).
            refused = refused_from_proto(await call.read())
        finally:
            call.cancel()

    assert [(r.session_id, r.step, r.incarnation) for r in refused] == [(session.session_id, 8, old_incarnation)]
    assert "epoch 1" in refused[0].reason and "epoch 2" in refused[0].reason, refused
    assert produced == expected
