"""In-process shards for the worker's unit tests: real ``Shard``s on real engine loops over the
fake backend, chained without gRPC.

``InProcessLink`` takes the transport's place and nothing else: it hands a frame to the next
shard's ``handle`` as the servicer would, and ends the session there when the stream closes, as
the servicer does when its stream ends. The wire itself is covered by the integration tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from meshnet.core.generation import GenerationRequest, SamplingParams
from meshnet.core.ids import NodeId, RequestId, SessionId
from meshnet.core.layers import LayerRange
from meshnet.engine.fake_backend import FakeBackend
from meshnet.engine.local_route import LocalRoute
from meshnet.node.shard import AnyShard, ShardIdentity, build_shard
from meshnet.node.stages import DownstreamLink
from meshnet.session.admission import AdmissionPolicy, CapacityPlan
from meshnet.session.engine_loop import EngineLoop
from meshnet.wire.frames import Continuation, FrameMeta, HopSpec, StepFrame, StepResult


def admission_policy(
    max_sessions: int, *, max_queue: int = 64, evict_idle_after: float = 30.0, ttl: float = 600.0
) -> AdmissionPolicy:
    """An admission policy with the worker's usual limits unless a test says otherwise."""
    return AdmissionPolicy(max_sessions, max_queue, evict_idle_after, ttl)


N_LAYERS = 6
FINGERPRINT = "fake-recipe"
CAPACITY = CapacityPlan(max_sessions=2, weight_bytes=1000, kv_bytes_per_session=300, other_bytes=0, budget_bytes=None)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_backend(layers: LayerRange, max_slots: int = 2) -> FakeBackend:
    return FakeBackend(layers, N_LAYERS, max_slots=max_slots, n_ctx_per_slot=256, max_batch_tokens=4)


class InProcessLink:
    def __init__(self, shard: AnyShard) -> None:
        self._shard = shard
        self._session: SessionId | None = None
        self.closed = False

    async def exchange(self, frame: StepFrame) -> StepResult:
        result = await self._shard.handle(frame, None)
        self._session = frame.meta.session_id
        return result

    async def close(self) -> None:
        self.closed = True
        if self._session is not None:
            await self._shard.end(self._session, "stream ended")


@dataclass
class Route:
    """Shards in route order, each on its own engine loop; ``links`` every stream opened."""

    shards: list[AnyShard]
    loops: list[EngineLoop]
    links: list[InProcessLink] = field(default_factory=list)

    @property
    def head(self) -> AnyShard:
        return self.shards[0]

    def backend(self, index: int) -> FakeBackend:
        backend = self.loops[index].backend
        if not isinstance(backend, FakeBackend):
            raise TypeError("the route runs fake backends")
        return backend

    def hops(self) -> tuple[HopSpec, ...]:
        return tuple(HopSpec(s.identity.address, s.shape.layers, FINGERPRINT) for s in self.shards[1:])

    async def close(self) -> None:
        for shard in self.shards:
            await shard.close()
        for loop in self.loops:
            await asyncio.to_thread(loop.stop)


async def start_route(
    ranges: Sequence[tuple[int, int]],
    *,
    policy: AdmissionPolicy | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Route:
    route = Route([], [])
    by_address: dict[str, AnyShard] = {}

    def connect(address: str, timeout: float | None, node_id: str | None = None) -> DownstreamLink:
        link = InProcessLink(by_address[address])
        route.links.append(link)
        return link

    for index, (start, stop) in enumerate(ranges):
        layers = LayerRange(start, stop)
        loop = EngineLoop(lambda layers=layers: fake_backend(layers))  # type: ignore[misc]
        await asyncio.to_thread(loop.start)
        address = f"shard-{index}"
        identity = ShardIdentity(NodeId(address), address, FINGERPRINT, "fake", "1", 4 * 1024 * 1024)
        shard = build_shard(identity, loop, policy or admission_policy(2), CAPACITY, connect, clock=clock)
        by_address[address] = shard
        route.shards.append(shard)
        route.loops.append(loop)
    return route


def opening(
    route: Route,
    session: str,
    prompt: Sequence[int],
    *,
    continuation: Continuation | None = None,
    epoch: int = 0,
    sampling: SamplingParams | None = None,
) -> StepFrame:
    head = route.head
    meta = FrameMeta(
        RequestId("r-" + session), SessionId(session), epoch, FINGERPRINT, head.shape.layers, "prefill", 0, 0, "new"
    )
    return StepFrame(
        meta,
        tokens=np.asarray(prompt, np.int32),
        downstream=route.hops(),
        sampling=sampling or SamplingParams(),
        continuation=continuation,
    )


def decode(first: StepFrame, *, step: int, position: int, token: int, epoch: int | None = None) -> StepFrame:
    meta = first.meta
    return StepFrame(
        FrameMeta(
            meta.request_id,
            meta.session_id,
            meta.route_epoch if epoch is None else epoch,
            meta.fingerprint,
            meta.layers,
            "decode",
            position,
            step,
            "continue",
        ),
        tokens=np.array([token], np.int32),
    )


def reference_tokens(ranges: Sequence[tuple[int, int]], prompt: Sequence[int], max_tokens: int) -> list[int]:
    """What the same fake shards chained by ``LocalRoute`` generate: the tokens a route must give."""
    route = LocalRoute([fake_backend(LayerRange(start, stop)) for start, stop in ranges])
    try:
        return list(route.generate(GenerationRequest(tuple(prompt), max_tokens, SamplingParams())))
    finally:
        route.close()
