"""Per-hop latency of served requests: which decode steps report it, and whose hop each figure is.

Every frame the route driver sends asks the shards for their ``HopTiming`` (``want_timings``),
and the head's own decode loop carries the request on, so each step's answer lists each hop's
time. Measuring and sending them costs a clock read and ~30 bytes per hop per step, which is in
the noise of a step; what would cost is pushing one more item through the gateway per token, so
the driver passes on the figures of one decode step in ``HOP_TIMING_EVERY`` only (the first
decode step and every ``HOP_TIMING_EVERY``-th after it). The prefill's answers are not used: a
chunk's time is not a step's latency.
"""

from __future__ import annotations

from collections.abc import Sequence

from meshnet.core.events import HopLatency, RouteHop
from meshnet.wire.frames import HopTiming

HOP_TIMING_EVERY = 8
"""One decode step in this many passes its hops' timings on to the gateway."""


def timing_due(decoded: int, every: int = HOP_TIMING_EVERY) -> bool:
    """Whether the ``decoded``-th decode step of a route (0-based, counted after its prefill)
    passes its hops' timings on: the first and every ``every``-th after it."""
    return decoded >= 0 and decoded % max(every, 1) == 0


def hop_latencies(hops: Sequence[RouteHop], timings: Sequence[HopTiming]) -> tuple[HopLatency, ...]:
    """The route's node ids with the seconds each took, matched by layer range (unique on a route,
    where a relayed hop's address can differ from the one it reports). A timing of no hop of the
    route (a shard answering for another range) is left out, so at most one figure per hop."""
    by_layers = {hop.layers: hop.node_id for hop in hops}
    latencies: dict[str, HopLatency] = {}
    for timing in timings:
        node = by_layers.get(timing.layers)
        if node is not None and node not in latencies:
            latencies[node] = HopLatency(node, (timing.queue_us + timing.compute_us) / 1e6)
    return tuple(latencies.values())
