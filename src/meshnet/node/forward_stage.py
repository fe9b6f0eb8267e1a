"""The output stage of any shard before the model's last layer: forward the boundary hidden
state to the next hop and answer with what comes back (``stages.OutputStage``).

A session keeps a ``Downstream``: the rest of its route and the stream to its next hop, opened
from its opening frame. The opening frame goes down that stream and its answer comes back up
it; every frame after it is a ``ring`` frame (``node.ring``): a forwarding head sends it on and
reads the tail's answer from the RingReturn stream it opened on the tail, and a middle forwards
it without answering. A decode row joins the next batch to its next hop where that hop takes
batches (``batches_to``); everything else goes on the session's own stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from meshnet.core.errors import EngineError, InvalidArgument
from meshnet.engine.backend import StepOutput
from meshnet.node.ring import MAX_CHUNKS_IN_FLIGHT, OpenRing, RingLeg, RingLink
from meshnet.node.stages import Rows, remaining_ms
from meshnet.route.coalescer import SeamCount
from meshnet.wire.frames import HopSpec, HopTiming, Phase, StepFrame, StepResult


class DownstreamLink(RingLink, Protocol):
    """The open session stream to the next hop (``route.shard_stream.ShardStream`` on the wire)."""

    async def exchange(self, frame: StepFrame) -> StepResult: ...

    async def close(self) -> None: ...


class RowSender(Protocol):
    """The ring's data plane (``route.ring_batch.RingLinks`` on the wire): a session's decode
    frame joins the next batch to its next hop, beside the frames of every other session there."""

    async def send(self, address: str, node_id: str | None, frame: StepFrame, owner: RingLeg) -> bool:
        """False where that hop takes no batches: the frame goes on the session's own stream.
        ``owner`` hears at once if the row is refused or lost (``RingLeg.row_lost``)."""
        ...


def batches_to(hop: HopSpec, phase: Phase) -> bool:
    """Whether a ring frame of ``phase`` to ``hop`` joins a batch there: a decode row, to a hop
    that advertised ``ring_batch`` (``core.features``). A prefill chunk is one per session, and
    large; an older hop would answer UNIMPLEMENTED only once rows were written to it."""
    return phase == "decode" and hop.ring_batch


Connect = Callable[[str, float | None, str | None], DownstreamLink]
"""Open the session stream to the next hop: its address, the whole stream's timeout in seconds
(None: none), the node id to pin."""


@dataclass(frozen=True)
class Downstream:
    """What a session keeps on a shard that forwards: the rest of its route and the stream on."""

    hops: tuple[HopSpec, ...]
    """The hops after this shard, in route order; the first is where ``link`` leads."""
    link: DownstreamLink
    stream_deadline: float | None
    ring: RingLeg = field(default_factory=RingLeg)
    """The ring side of ``link``, once the session's first ring frame has passed (``node.ring``)."""


class ForwardStage:
    """Any shard before the model's last layer: pass the boundary hidden state to the next hop.

    ``open_ring`` opens the tail's RingReturn stream of a session: a head's, which reads the
    tail's answers to its ring frames there. None on a middle, which answers nothing for them.
    ``rows`` batches decode frames per next hop (None: each on its session's own stream);
    ``seams`` counts what this shard sends on its sessions' own streams.
    """

    def __init__(
        self,
        n_layers: int,
        connect: Connect,
        *,
        open_ring: OpenRing | None,
        rows: RowSender | None = None,
        seams: SeamCount | None = None,
    ) -> None:
        self._n_layers = n_layers
        self._connect = connect
        self._open_ring = open_ring
        self._rows = rows
        self._seams = SeamCount() if seams is None else seams

    def check(self, frame: StepFrame) -> None:
        if frame.downstream:
            # Only where the route continues, and only to its end: a frame must not be able to
            # make a shard open channels to arbitrary addresses.
            if frame.meta.cache != "new":
                raise InvalidArgument("downstream hops belong only in the opening frame of a non-tail shard")
            if frame.downstream[-1].layers.stop != self._n_layers:
                raise InvalidArgument(
                    f"the route's hops end at layer {frame.downstream[-1].layers.stop}, "
                    f"not at the model's {self._n_layers}"
                )
        elif frame.meta.cache == "new":
            raise InvalidArgument("a non-tail shard needs the downstream hops in the opening frame")

    def check_opening(self, frame: StepFrame) -> None:
        return None  # ``check`` already insists on the hops in every opening frame

    def open_state(self, frame: StepFrame, stream_deadline: float | None) -> Downstream:
        # The shard admitted the frame's ticket first (``node.tickets``): these hops are the
        # ticket's, so this dials only the next hop the tracker put on the session's route.
        timeout = None if stream_deadline is None else max(stream_deadline - time.monotonic(), 0.001)
        first = frame.downstream[0]
        link = self._connect(first.address, timeout, first.node_id or None)
        return Downstream(frame.downstream, link, stream_deadline)

    def rows(self, state: Downstream, frame: StepFrame) -> Rows:
        return "last" if frame.final_chunk else "none"  # a forwarding shard's output is its hidden rows

    def route_shards(self, state: Downstream) -> int:
        return 1 + len(state.hops)  # this shard and the hops its session keeps after it

    async def emit(
        self, state: Downstream, frame: StepFrame, output: StepOutput, deadline: float | None, timing: HopTiming | None
    ) -> StepResult:
        if output.hidden is None:
            raise EngineError("the engine returned no hidden state on a shard that forwards")
        left_ms = remaining_ms(deadline, "the step's deadline passed on this shard")
        # Only the opening frame travels off the ring (the shard refuses any other that does).
        opening = not frame.ring
        outgoing = StepFrame(
            meta=replace(frame.meta, layers=state.hops[0].layers, deadline_ms=left_ms),
            hidden=output.hidden,
            downstream=state.hops[1:] if opening else (),
            sampling=frame.sampling if opening else None,
            final_chunk=frame.final_chunk,
            ring=frame.ring,
            want_timings=frame.want_timings,
            timings=(*frame.timings, timing) if frame.ring and timing is not None else (),
            ticket=frame.ticket if opening else None,  # each shard down the route checks it too
            kv=frame.kv if opening else None,  # the chain this head checked against the tokens
            snapshot=frame.snapshot if opening else None,
            embedding=frame.embedding if opening else None,
        )
        if frame.ring:
            return await self._ring_step(state, frame, outgoing, deadline)
        # The opening frame goes down the chain and its answer comes back up it: the tail holds
        # the session (and with it the ring's mailbox) only once the opening frame has reached it.
        answer = await state.link.exchange(outgoing)
        return answer if timing is None else replace(answer, timings=(timing, *answer.timings))

    async def _ring_step(
        self, state: Downstream, frame: StepFrame, outgoing: StepFrame, deadline: float | None
    ) -> StepResult:
        meta, leg = frame.meta, state.ring
        is_head = self._open_ring is not None
        if self._open_ring is not None and leg.back is None:
            # Opened before the first ring frame leaves; the tail keeps answers until it is read.
            timeout = None if state.stream_deadline is None else max(state.stream_deadline - time.monotonic(), 0.001)
            leg.back = self._open_ring(state.hops[-1], meta.session_id, meta.request_id, timeout)
            leg.answered_through = meta.step - 1  # the opening frame was answered on the chain
        leg.start(state.link)
        failure = leg.failure()
        if failure is not None:
            raise failure
        waits = is_head and frame.final_chunk
        if is_head and not waits:
            # Pipelined prefill: bound the chunks the tail has not answered yet.
            await leg.acknowledged(meta.step - MAX_CHUNKS_IN_FLIGHT, deadline)
        await self._forward(state, outgoing)
        if waits:
            return await leg.answer(meta.step, deadline)
        # A middle answers nothing upstream (the tail's answer goes straight to the head); the
        # head acknowledges a forwarded prefill chunk at once, so the sender sends the next one.
        return StepResult(meta.session_id, meta.step, meta.position + frame.n_tokens, None)

    async def _forward(self, state: Downstream, outgoing: StepFrame) -> None:
        """A ring frame to the next hop: a decode step in the next batch there, a prefill chunk
        (one per session, and large) on the session's own stream."""
        hop = state.hops[0]
        rows = self._rows
        if rows is not None and batches_to(hop, outgoing.meta.phase):
            state.ring.batched_step = outgoing.meta.step
            if await rows.send(hop.address, hop.node_id or None, outgoing, state.ring):
                return  # the batch link counted it
        await state.link.send(outgoing)
        self._seams.add(1)

    async def release(self, state: Downstream) -> None:
        # Ending the stream makes the next shard release the session and close its own link.
        if state.ring.watch is not None or state.ring.back is not None:
            await state.ring.close(state.link)
        else:
            await state.link.close()
