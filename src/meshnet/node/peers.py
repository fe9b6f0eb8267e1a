"""Measure the round trip to the shards that could follow this one in a route.

The tracker costs every seam of a route by observed latency (Petals' RTT-based routing); it
tells each worker which candidate next hops to measure, and the worker reports the results in
its heartbeat. A probe is a gRPC health check (the cheapest call a worker serves), best of a
few, so a slow moment does not make a near peer look far.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from meshnet.route.shard_admin import is_serving
from meshnet.route.shard_stream import ChannelPool

PROBES_PER_PEER = 3
PROBE_TIMEOUT_S = 1.0


class PeerProber:
    def __init__(self, pool: ChannelPool, interval_s: float = 2.0) -> None:
        self._pool = pool
        self._interval_s = interval_s
        self._targets: tuple[str, ...] = ()
        self._rtt_ms: dict[str, float] = {}

    def set_targets(self, targets: tuple[str, ...]) -> None:
        self._targets = targets
        self._rtt_ms = {address: rtt for address, rtt in self._rtt_ms.items() if address in targets}

    def latest(self) -> tuple[tuple[str, float], ...]:
        return tuple(sorted(self._rtt_ms.items()))

    async def measure(self, address: str) -> float | None:
        """Best round trip to ``address`` in ms; for ``NODE@RELAY`` through its relay, pinned to
        that node (``meshnet.relay.dial``): what a seam into a node behind NAT costs."""
        best = None
        for _ in range(PROBES_PER_PEER):
            started = time.perf_counter()
            if not await is_serving(self._pool, address, timeout_s=PROBE_TIMEOUT_S):
                return None  # unreachable or leaving: report nothing rather than a made-up distance
            elapsed = (time.perf_counter() - started) * 1000.0
            best = elapsed if best is None else min(best, elapsed)
        return best

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for address in self._targets:
                rtt = await self.measure(address)
                if rtt is None:
                    self._rtt_ms.pop(address, None)
                elif address in self._targets:
                    self._rtt_ms[address] = rtt
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._interval_s)
