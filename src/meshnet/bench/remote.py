"""The ``meshnet-N`` lane: N worker processes over loopback gRPC, driven by the route driver.

No tracker is involved: the route is built from the workers' ready lines and, once per lane,
each worker's own description of itself (GetCapability, an admin call: no request asks it, as
none does in a swarm, where the tracker's route carries it). Concurrency k is k
drivers running at once on one event loop (as a gateway would run k requests); the workers'
``batch_occupancy`` counters, read before and after, say how many sessions each engine batch
actually carried during the run, and their ``seam_messages_total`` how many gRPC messages
crossed the route's seams.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from meshnet.bench.stats import RequestTrace, RunRecord
from meshnet.bench.tickets import LaneTickets
from meshnet.bench.workers import WorkerSet
from meshnet.core.errors import MeshnetError
from meshnet.core.events import RouteHop, TokenGenerated
from meshnet.core.generation import GenerationRequest
from meshnet.route.driver import RouteDriver
from meshnet.route.route_run import RouteSession
from meshnet.route.shard_admin import describe_hop, fetch_metrics
from meshnet.route.shard_stream import ChannelPool

IDLE_WAIT_S = 3.0


class MeshnetLane:
    def __init__(
        self, workers: WorkerSet, pool: ChannelPool, driver: RouteDriver, *, timeout_s: float, tickets: LaneTickets
    ) -> None:
        self.workers = workers
        self.pool = pool
        self.driver = driver
        self.timeout_s = timeout_s
        self.tickets = tickets
        self._hops: tuple[RouteHop, ...] | None = None

    async def hops(self) -> tuple[RouteHop, ...]:
        """The route's hops, each as its worker describes itself (asked once per lane)."""
        if self._hops is None:
            endpoints = self.workers.endpoints
            self._hops = tuple(await asyncio.gather(*(describe_hop(self.pool, a, n) for a, n in endpoints)))
        return self._hops

    async def session(self) -> RouteSession:
        return self.tickets.session(await self.hops(), self.workers.fingerprint)

    async def metrics(self) -> list[dict[str, float]]:
        addresses = [address for address, _ in self.workers.endpoints]
        return list(await asyncio.gather(*(fetch_metrics(self.pool, address) for address in addresses)))

    async def run(self, prompts: Sequence[tuple[int, ...]], indices: Sequence[int], max_tokens: int) -> RunRecord:
        before = await self.metrics()
        started = time.perf_counter()
        traces = await asyncio.gather(
            *(self._one(prompt, index, max_tokens, started) for prompt, index in zip(prompts, indices, strict=True))
        )
        finished = time.perf_counter()
        after = await self.metrics()
        await self.wait_idle()
        return RunRecord(
            len(prompts),
            started,
            finished,
            tuple(traces),
            occupancy(before, after),
            seam_messages(before, after),
            seam_messages(before, after, "seam_rows_total"),
        )

    async def _one(self, prompt: tuple[int, ...], index: int, max_tokens: int, started: float) -> RequestTrace:
        times: list[float] = []
        tokens: list[int] = []
        error = None
        # No stop tokens: every lane generates exactly max_tokens, so outputs compare one to one.
        request = GenerationRequest(prompt, max_tokens)
        try:
            async with asyncio.timeout(self.timeout_s):
                async for event in self.driver.run(await self.session(), request):
                    if isinstance(event, TokenGenerated):
                        times.append(time.perf_counter())
                        tokens.append(event.token_id)
        except MeshnetError as failure:
            error = f"{failure.code}: {failure.message}"
        except TimeoutError:
            error = f"timeout: no answer within {self.timeout_s:.0f} s"
        finished = times[-1] if times and error is None else time.perf_counter()
        return RequestTrace(index, len(prompt), started, tuple(times), tuple(tokens), finished, error)

    async def wait_idle(self) -> None:
        """Let the workers free the finished sessions before the next run starts."""
        deadline = time.monotonic() + IDLE_WAIT_S
        while time.monotonic() < deadline:
            if not any(m.get("active_sessions", 0.0) for m in await self.metrics()):
                return
            await asyncio.sleep(0.02)


def seam_messages(
    before: list[dict[str, float]], after: list[dict[str, float]], counter: str = "seam_messages_total"
) -> int:
    """Messages every worker sent to another shard between two metric snapshots (the workers
    count them as they send: ``node.shard``, ``route.ring_batch``); with ``counter``
    ``seam_rows_total``, the session rows those messages carried."""
    return round(sum(new.get(counter, 0.0) - old.get(counter, 0.0) for old, new in zip(before, after, strict=True)))


def occupancy(before: list[dict[str, float]], after: list[dict[str, float]]) -> float | None:
    """Mean over workers of decode steps per engine batch between two metric snapshots."""
    values = []
    for old, new in zip(before, after, strict=True):
        steps = new.get("decode_steps_total", 0.0) - old.get("decode_steps_total", 0.0)
        batches = new.get("decode_batches_total", 0.0) - old.get("decode_batches_total", 0.0)
        if batches > 0:
            values.append(steps / batches)
    return sum(values) / len(values) if values else None
