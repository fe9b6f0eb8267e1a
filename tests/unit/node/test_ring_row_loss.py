"""A ring row that is refused or lost ends its session's downstream at once (``RingLeg.row_lost``),
and rows are batched only to a hop that advertised ring batches (``forward_stage.batches_to``)."""

from __future__ import annotations

import asyncio

from meshnet.core.errors import Unavailable
from meshnet.core.events import RouteHop
from meshnet.core.features import RING_BATCH, TAIL_FEATURES, takes_ring_batches
from meshnet.core.ids import LegIncarnation, NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import NodeCapability
from meshnet.node.forward_stage import batches_to
from meshnet.node.ring import RingLeg, watch_error
from meshnet.route.route_run import RouteSession
from meshnet.wire.batch_frames import LostRow
from meshnet.wire.frames import HopSpec, StepFrame, StepResult


class OpenLink:
    """A downstream stream that stays open (the next hop never ends it by itself)."""

    def __init__(self) -> None:
        self.read_cancelled = asyncio.Event()

    async def send(self, frame: StepFrame) -> None:
        raise AssertionError("nothing is sent in this test")

    async def read(self) -> StepResult:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.read_cancelled.set()
            raise
        raise AssertionError("unreachable")

    async def finish_writing(self) -> None:
        return None

    def cancel(self) -> None:
        return None


async def started_leg() -> tuple[RingLeg, OpenLink]:
    link, leg = OpenLink(), RingLeg()
    leg.start(link)
    await asyncio.sleep(0)  # the watch is reading
    return leg, link


async def test_a_lost_row_ends_the_watch_at_once_with_its_error() -> None:
    leg, link = await started_leg()
    leg.batched_step = 7
    refused = Unavailable("127.0.0.1:2 refused the session's ring row of step 7: no such session")
    leg.row_lost(LostRow(7, leg.incarnation), refused)
    assert leg.watch is not None
    await asyncio.wait({leg.watch}, timeout=5)
    assert watch_error(leg.watch) is refused
    assert leg.failure() is refused
    assert link.read_cancelled.is_set()  # the downstream stream goes with it


async def test_a_broken_stream_fails_the_last_batched_row_unless_the_tail_answered_it() -> None:
    leg, _ = await started_leg()
    leg.batched_step, leg.answered_through = 4, 4  # a head: the tail answered step 4 already
    leg.row_lost(LostRow(None, leg.incarnation), Unavailable("the ring batch stream broke"))
    await asyncio.sleep(0)
    assert leg.watch is not None and not leg.watch.done()
    leg.batched_step = 5  # the next row went into the stream, unanswered
    broke = Unavailable("the ring batch stream broke")
    leg.row_lost(LostRow(None, leg.incarnation), broke)
    await asyncio.wait({leg.watch}, timeout=5)
    assert leg.failure() is broke


async def test_a_leg_ignores_a_refusal_of_another_incarnation_and_takes_its_own() -> None:
    # The session was opened again under the same id: the old opening's row, refused late,
    # names the old incarnation (``loses_row``).
    leg, _ = await started_leg()
    leg.incarnation, leg.batched_step = LegIncarnation(5), 6
    leg.row_lost(LostRow(6, LegIncarnation(4)), Unavailable("the old opening's row"))
    await asyncio.sleep(0)
    assert leg.watch is not None and not leg.watch.done() and leg.failure() is None
    refused = Unavailable("this opening's row was refused")
    leg.row_lost(LostRow(6, leg.incarnation), refused)
    await asyncio.wait({leg.watch}, timeout=5)
    assert leg.failure() is refused


async def test_the_first_loss_is_the_one_reported() -> None:
    leg, _ = await started_leg()
    first, second = Unavailable("first"), Unavailable("second")
    leg.row_lost(LostRow(0, leg.incarnation), first)
    leg.row_lost(LostRow(0, leg.incarnation), second)
    assert leg.watch is not None
    await asyncio.wait({leg.watch}, timeout=5)
    assert leg.failure() is first


async def test_a_clean_close_is_still_a_cancellation() -> None:
    leg, link = await started_leg()
    await leg.close(link)
    assert leg.watch is not None
    await asyncio.wait({leg.watch}, timeout=5)
    assert leg.watch.cancelled()


def hop(ring_batch: bool) -> HopSpec:
    return HopSpec("127.0.0.1:2", LayerRange(3, 6), "rcp-1", "node-b", ring_batch)


def test_only_decode_rows_to_a_hop_that_advertised_ring_batches_are_batched() -> None:
    assert batches_to(hop(True), "decode")
    assert not batches_to(hop(True), "prefill")  # one large chunk per session: its own stream
    assert not batches_to(hop(False), "decode")  # an older hop: per-session streams from row one
    assert not batches_to(hop(False), "prefill")


def test_a_node_advertises_ring_batches_and_an_older_record_does_not() -> None:
    assert takes_ring_batches(NodeCapability(64, 8, 64, 1 << 20, 8, 1).features)
    assert not takes_ring_batches(TAIL_FEATURES)  # a record from before ring batches
    assert RING_BATCH not in TAIL_FEATURES


def test_the_opening_frames_hops_carry_each_nodes_advertisement() -> None:
    new = NodeCapability(64, 8, 64, 1 << 20, 8, 1)
    old = NodeCapability(64, 8, 64, 1 << 20, 8, 1, features=TAIL_FEATURES)
    hops = (
        RouteHop(NodeId("a"), "a:1", LayerRange(0, 2), new),
        RouteHop(NodeId("b"), "b:1", LayerRange(2, 4), old),
        RouteHop(NodeId("c"), "c:1", LayerRange(4, 6), new),
    )
    route = RouteSession(RequestId("r"), SessionId("s"), hops, "rcp-1", 0)
    assert [(h.address, h.ring_batch) for h in route.downstream()] == [("b:1", False), ("c:1", True)]
