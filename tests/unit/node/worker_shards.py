"""In-process routes for the worker's unit tests: real ``Shard``s on real engine loops, wired
head -> middle -> tail as production wires them, without gRPC.

What stands in for what:

- ``InProcessStream`` is a Session stream: a task runs the servicer's own per-stream loop
  (``node.session_stream.SessionStream``) on the receiving shard, so what goes back up a stream
  (nothing for a ring frame past the head), the race of a middle's next frame against its
  downstream, and the teardown of a session when its stream ends or fails are production's.
- ``InProcessRing`` is the head's RingReturn stream: it reads the tail's ``RingMailbox``, the
  same object the servicer's ``RingReturn`` serves over gRPC. Every head gets one (``open_ring``
  is required), so every frame after the opening one runs on the ring, as in production.
- ``FakeBackend`` stands in for llama.cpp: deterministic arithmetic whose output depends on every
  earlier token of a slot. It shows the protocol (order, repeats, refusals, teardown, batching,
  the ring's routing and failure propagation) but not real KV isolation or numerics; those are
  covered by the integration tests with llama.cpp (``tests/model``). Tests can make one fail or
  stall (``Backend.fail_with``, ``Backend.stall``), as an engine error or a slow hop would.

The transport itself (protobuf, status codes, TLS, deadlines on calls) is covered by the
integration tests, which run worker processes over gRPC.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from meshnet.core.errors import MeshnetError, Unavailable
from meshnet.core.generation import GenerationRequest, SamplingParams
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.core.node_record import HardwareSummary, NodeCapability, NodeRecord
from meshnet.core.tickets import DEFAULT_TICKET_S, SealedTicket
from meshnet.engine.backend import ShardShape, StepInput, StepOutput
from meshnet.engine.certification import certify_fake_engine
from meshnet.engine.fake_backend import FakeBackend
from meshnet.engine.local_route import LocalRoute
from meshnet.node.assembly import fake_recipe
from meshnet.node.config import FakeModel
from meshnet.node.session_stream import SessionStream
from meshnet.node.shard import AnyShard
from meshnet.node.shard_wiring import build_shard
from meshnet.node.tickets import TicketGate
from meshnet.session.admission import AdmissionPolicy, CapacityPlan, PeerBounds
from meshnet.session.engine_loop import EngineLoop
from meshnet.session.kv_store import KvStore
from meshnet.wire.frames import Continuation, FrameMeta, HopSpec, Phase, StepFrame, StepResult
from meshnet.wire.ticket_wire import issue_ticket

USUAL_PEERS = PeerBounds(share=0.5, min_token_rate=0.5, grace=60.0)
"""The worker's default peer bounds (``WorkerConfig.session_*``)."""


def admission_policy(
    max_sessions: int,
    *,
    max_queue: int = 64,
    evict_idle_after: float = 30.0,
    ttl: float = 600.0,
    peers: PeerBounds = USUAL_PEERS,
) -> AdmissionPolicy:
    """An admission policy with the worker's usual limits unless a test says otherwise."""
    return AdmissionPolicy(max_sessions, max_queue, evict_idle_after, ttl, peers)


N_LAYERS = 6
RECIPE = fake_recipe(FakeModel(n_layers=N_LAYERS))
FINGERPRINT = RECIPE.fingerprint()
CHUNK_TOKENS = 4
"""Every shard's prefill chunk (the fake backend's ``max_batch_tokens``)."""
CAPACITY = CapacityPlan(max_sessions=2, weight_bytes=1000, kv_bytes_per_session=300, other_bytes=0, budget_bytes=None)
STEP_DEADLINE_MS = 5000
"""Every ring frame's deadline unless a test gives another: a lost answer fails its test in
seconds instead of hanging it."""
STALL_LIMIT_S = 10.0
"""A stalled backend runs on after this long however the test ends, so no engine thread hangs."""


class Backend(FakeBackend):
    """The fake backend, which a test can make fail (an engine error) or stall (a slow hop)."""

    def __init__(self, layers: LayerRange, max_slots: int = 2) -> None:
        super().__init__(layers, N_LAYERS, max_slots=max_slots, n_ctx_per_slot=256, max_batch_tokens=CHUNK_TOKENS)
        self.fail_with: Exception | None = None
        """Raised by every batch from now on, when set."""
        self.batches_begun = 0
        """Batches handed to this backend, stalled ones included."""
        self.running = threading.Event()
        """Cleared, every batch waits until it is set again (a stalled hop)."""
        self.running.set()
        self.route_shards: list[int] = []
        """``StepInput.route_shards`` of every step run, in order."""

    def stall(self) -> None:
        self.running.clear()

    def run(self, batch: list[StepInput]) -> list[StepOutput]:
        self.batches_begun += 1
        self.running.wait(STALL_LIMIT_S)
        if self.fail_with is not None:
            raise self.fail_with
        self.route_shards.extend(step.route_shards for step in batch)
        return super().run(batch)


class _Frames:
    """The frames written into a stream, read in order until it is half-closed (None)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[StepFrame | None] = asyncio.Queue()

    def __aiter__(self) -> _Frames:
        return self

    async def __anext__(self) -> StepFrame:
        frame = await self.queue.get()
        if frame is None:
            self.queue.put_nowait(None)  # a half-closed stream stays ended
            raise StopAsyncIteration
        return frame


class _Answers:
    """What comes back on a stream, in order; once it has ended, every read says how."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[StepResult | MeshnetError] = asyncio.Queue()
        self.ended: MeshnetError | None = None

    def put(self, item: StepResult | MeshnetError) -> None:
        if self.ended is None:
            self._queue.put_nowait(item)
        if isinstance(item, MeshnetError) and self.ended is None:
            self.ended = item

    async def read(self) -> StepResult:
        item = await self._queue.get()
        if isinstance(item, MeshnetError):
            self._queue.put_nowait(item)
            raise item
        return item


class InProcessStream:
    """A Session stream into ``shard``: what the servicer runs per stream, minus the wire."""

    def __init__(self, shard: AnyShard, timeout: float | None) -> None:
        self.address = shard.record.address
        self._frames = _Frames()
        self._answers = _Answers()
        self._severed = False
        deadline = None if timeout is None else time.monotonic() + timeout
        self._serving = asyncio.ensure_future(self._serve(shard, deadline))

    async def _serve(self, shard: AnyShard, deadline: float | None) -> None:
        stream = SessionStream(shard, deadline)
        failure: MeshnetError | None = None
        try:
            while (frame := await stream.next_frame(self._frames)) is not None:
                result = await stream.run(frame)
                async for answer in stream.answers(frame, result):
                    self._answers.put(answer)
        except MeshnetError as error:
            failure = error
        finally:
            await stream.end(failure)
        self._answers.put(failure or Unavailable(f"shard {self.address} closed the session stream"))

    async def exchange(self, frame: StepFrame) -> StepResult:
        await self.send(frame)
        return await self.read()

    async def send(self, frame: StepFrame) -> None:
        if self._answers.ended is not None:
            raise self._answers.ended  # as a write on a finished call reports how it ended
        self._frames.queue.put_nowait(frame)

    async def read(self) -> StepResult:
        return await self._answers.read()

    async def finish_writing(self) -> None:
        if not self._severed:
            self._frames.queue.put_nowait(None)

    @property
    def ended(self) -> bool:
        """Whether the receiving shard is done with the stream (and so with its session)."""
        return self._serving.done()

    async def close(self) -> None:
        await self.finish_writing()
        if not self._severed:
            await asyncio.wait({self._serving}, timeout=1.0)  # as ``ShardStream.close`` waits
        self.cancel()

    def cancel(self) -> None:
        self._answers.put(Unavailable(f"the session stream to {self.address} was cancelled"))
        if not self._severed:
            self._serving.cancel()

    def sever(self) -> None:
        """Lose the connection under the stream: the sending side sees the stream fail, and the
        receiving shard hears nothing of it, as on a half-open link (its session stays)."""
        self._answers.put(Unavailable(f"the connection to {self.address} was lost"))
        self._severed = True

    def stop(self) -> None:
        """Teardown: stop serving the stream, severed or not."""
        self._serving.cancel()


class InProcessRing:
    """The head's RingReturn stream of a session: the tail's ``RingMailbox``, served as the
    servicer's ``RingReturn`` serves it."""

    def __init__(self, tail: AnyShard, session_id: SessionId, request_id: RequestId) -> None:
        self.address = tail.record.address
        self._tail = tail
        self._answers = _Answers()
        self._serving = asyncio.ensure_future(self._serve(tail, session_id, request_id))

    async def _serve(self, tail: AnyShard, session_id: SessionId, request_id: RequestId) -> None:
        try:
            await tail.ring_mailbox(session_id, request_id).serve(self._write)
            end: MeshnetError = Unavailable(f"the tail {self.address} closed the session's ring")
        except MeshnetError as error:
            end = error
        self._answers.put(end)

    async def _write(self, result: StepResult) -> None:
        if self._serving.cancelled():
            raise RuntimeError("the RingReturn call is closed")
        self._answers.put(result)
        self._tail.seams.add(1)  # counted where it is written, as the servicer's RingReturn does

    async def read(self) -> StepResult:
        return await self._answers.read()

    def cancel(self) -> None:
        self._serving.cancel()


@dataclass
class Route:
    """Shards in route order, each on its own engine loop, wired as production wires them;
    ``streams`` and ``rings`` hold every stream and RingReturn stream opened."""

    shards: list[AnyShard]
    loops: list[EngineLoop]
    streams: list[InProcessStream] = field(default_factory=list)
    rings: list[InProcessRing] = field(default_factory=list)
    wall_clock: Callable[[], float] = time.time
    """Unix seconds, as the shards' ticket gates read them: tickets are issued on this clock."""

    @property
    def head(self) -> AnyShard:
        return self.shards[0]

    def backend(self, index: int) -> Backend:
        backend = self.loops[index].backend
        if not isinstance(backend, Backend):
            raise TypeError("the route runs the harness's fake backends")
        return backend

    def hops(self) -> tuple[HopSpec, ...]:
        return tuple(HopSpec(s.record.address, s.shape.layers, FINGERPRINT, s.node_id) for s in self.shards[1:])

    def ticket(
        self,
        session: str,
        *,
        request: str | None = None,
        epoch: int = 0,
        seconds: float = DEFAULT_TICKET_S,
        age_s: float = 0.0,
    ) -> SealedTicket:
        """An unsigned ticket for ``session`` on this whole route, as an unsecured tracker issues
        it, issued ``age_s`` ago and lasting ``seconds``."""
        placed = (HopSpec(self.head.record.address, self.head.shape.layers, FINGERPRINT, self.head.node_id),)
        return issue_ticket(
            placed + self.hops(),
            session_id=SessionId(session),
            request_id=None if request is None else RequestId(request),
            epoch=epoch,
            fingerprint=FINGERPRINT,
            holder=None,
            now_unix_s=self.wall_clock() - age_s,
            seconds=seconds,
            signer=None,
        )

    def sender(self, timeout: float | None = None) -> InProcessStream:
        """A stream into the head, as the route driver opens one."""
        return InProcessStream(self.head, timeout)

    async def close(self) -> None:
        for index in range(len(self.loops)):
            self.backend(index).running.set()
        for shard in self.shards:
            await shard.close()
        for stream in self.streams:
            stream.stop()
        for ring in self.rings:
            ring.cancel()
        for loop in self.loops:
            await asyncio.to_thread(loop.stop)


async def start_route(
    ranges: Sequence[tuple[int, int]],
    *,
    policy: AdmissionPolicy | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    kv_budget: int = 0,
) -> Route:
    """Shards of ``ranges`` wired into one route; ``clock`` times sessions, ``wall_clock`` tickets."""
    route = Route([], [], wall_clock=wall_clock)
    by_address: dict[str, AnyShard] = {}

    def connect(address: str, timeout: float | None, node_id: str | None = None) -> InProcessStream:
        stream = InProcessStream(by_address[address], timeout)
        route.streams.append(stream)
        return stream

    def open_ring(tail: HopSpec, session: SessionId, request: RequestId, timeout: float | None) -> InProcessRing:
        ring = InProcessRing(by_address[tail.address], session, request)
        route.rings.append(ring)
        return ring

    for index, (start, stop) in enumerate(ranges):
        layers = LayerRange(start, stop)
        loop = EngineLoop(lambda layers=layers: Backend(layers))  # type: ignore[misc]
        await asyncio.to_thread(loop.start)
        address = f"shard-{index}"
        record = shard_record(address, loop.backend.shape)
        admission = policy or admission_policy(2)
        tickets = TicketGate(None, wall_clock)
        shard = build_shard(
            NodeId(address),
            record,
            loop,
            admission,
            CAPACITY,
            connect,
            open_ring=open_ring,
            tickets=tickets,
            kv_store=KvStore(kv_budget),
            clock=clock,
        )
        by_address[address] = shard
        route.shards.append(shard)
        route.loops.append(loop)
    return route


def shard_record(address: str, shape: ShardShape) -> NodeRecord:
    """The record a fake worker of this shape registers, with its fake engine's real certification."""
    capability = NodeCapability(
        n_ctx_per_session=shape.n_ctx_per_slot,
        prefill_chunk_tokens=shape.max_batch_tokens,
        max_tokens_per_frame=shape.n_ctx_per_slot,
        max_frame_bytes=4 * 1024 * 1024,
        n_embd=shape.n_embd,
        max_sessions=shape.max_slots,
    )
    certification = certify_fake_engine(N_LAYERS, RECIPE.n_embd, 64).bound_to(FINGERPRINT)
    hardware = HardwareSummary(cpu_count=2, memory_bytes=1 << 30)
    return NodeRecord(address, RECIPE, FINGERPRINT, "fake", "none", shape.layers, hardware, capability, certification)


def opening(
    route: Route,
    session: str,
    prompt: Sequence[int],
    *,
    continuation: Continuation | None = None,
    epoch: int = 0,
    sampling: SamplingParams | None = None,
    final_chunk: bool = True,
    ticket_seconds: float = DEFAULT_TICKET_S,
) -> StepFrame:
    """Step 0 of a session at the head: the frame that travels down the chain and opens it, with
    the route's ticket lasting ``ticket_seconds``."""
    head = route.head
    meta = FrameMeta(
        RequestId("r-" + session), SessionId(session), epoch, FINGERPRINT, head.shape.layers, "prefill", 0, 0, "new"
    )
    return StepFrame(
        meta,
        tokens=np.asarray(prompt, np.int32),
        downstream=route.hops(),
        sampling=sampling or SamplingParams(),
        final_chunk=final_chunk,
        continuation=continuation,
        ticket=route.ticket(session, epoch=epoch, seconds=ticket_seconds),
    )


def on_ring(
    first: StepFrame,
    tokens: Sequence[int],
    *,
    step: int,
    position: int,
    phase: Phase = "decode",
    final_chunk: bool = True,
    epoch: int | None = None,
    deadline_ms: int | None = STEP_DEADLINE_MS,
) -> StepFrame:
    """A later frame of ``first``'s session into the head: a ring frame, as every one is."""
    meta = first.meta
    epoch = meta.route_epoch if epoch is None else epoch
    header = FrameMeta(
        meta.request_id,
        meta.session_id,
        epoch,
        meta.fingerprint,
        meta.layers,
        phase,
        position,
        step,
        "continue",
        deadline_ms=deadline_ms,
    )
    return StepFrame(header, tokens=np.asarray(tokens, np.int32), final_chunk=final_chunk, ring=True)


def decode(
    first: StepFrame,
    *,
    step: int,
    position: int,
    token: int,
    epoch: int | None = None,
    deadline_ms: int | None = STEP_DEADLINE_MS,
) -> StepFrame:
    """Decode step ``step`` of ``first``'s session: one token, on the ring."""
    return on_ring(first, (token,), step=step, position=position, epoch=epoch, deadline_ms=deadline_ms)


def reference_tokens(ranges: Sequence[tuple[int, int]], prompt: Sequence[int], max_tokens: int) -> list[int]:
    """What the same fake shards chained by ``LocalRoute`` generate: the tokens a route must give."""
    route = LocalRoute([Backend(LayerRange(start, stop)) for start, stop in ranges])
    try:
        return list(route.generate(GenerationRequest(tuple(prompt), max_tokens, SamplingParams())))
    finally:
        route.close()
