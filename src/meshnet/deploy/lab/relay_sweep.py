"""``meshnet lab sweep --private 1``: what a relayed hop costs per token against a direct one.

Each point of the grid builds two labs of the same shape, one after the other: the middle
node public (direct), then the middle node behind its NAT router, reached through the relay
node (relayed). Both have the same nodes, pinned to the same cores, and the same relay node
(idle in the direct lab), so the only difference is the path of the hop into the middle node.
Each is measured as the network sweep measures a point (``sweep.measure_point``).

Where the delays are: every node's inbound link has a delay line (``delay_line.py``), and the
relay sits behind its node's. A direct hop into the middle crosses the middle's delay line once;
the relayed hop crosses the relay's twice (the dialer's connection into the relay, then the
private node's own outbound connection to the relay, whose replies carry the bytes to it), so
the relayed route's token loop crosses one more one-way delay. What the relay adds beyond that
(its splicing, one more TCP and TLS stream, its link's rate) is the per-token overhead less that
delay, attributed to the one relay crossing a token makes.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from meshnet.core.errors import InvalidArgument
from meshnet.deploy.lab.lab import Lab, LabConfig
from meshnet.deploy.lab.plan import SWEEP_DELAYS_MS, SWEEP_RATES_MBIT
from meshnet.deploy.lab.swarm import start_swarm
from meshnet.deploy.lab.sweep import SweepPoint, measure_point

EXTRA_DELAYS_PER_TOKEN = 1
"""One-way delays a token's loop crosses on the relayed route beyond the direct one (see above)."""
RELAY_CROSSINGS_PER_TOKEN = 1
"""Times a token's loop passes through the relay: only the hop into the private middle node."""
PROCESSING_BUDGET_MS = 0.5
"""The issue's figure: a relay crossing may add its link delays and at most this much."""


@dataclass(frozen=True)
class RelayPoint:
    delay_ms: float
    bandwidth_mbit: float
    direct: SweepPoint
    relayed: SweepPoint
    overhead_ms: float = 0.0
    """Per-token time of the relayed route less the direct route's (medians)."""
    processing_per_crossing_ms: float = 0.0
    """The overhead less the relayed route's extra one-way delay, per relay crossing."""
    ttft_overhead_ms: float = 0.0


def compare(delay_ms: float, rate: float, direct: SweepPoint, relayed: SweepPoint) -> RelayPoint:
    """The relayed point judged against the direct one of the same link shape."""
    overhead = relayed.per_token_ms - direct.per_token_ms
    processing = (overhead - EXTRA_DELAYS_PER_TOKEN * delay_ms) / RELAY_CROSSINGS_PER_TOKEN
    return RelayPoint(
        delay_ms=delay_ms,
        bandwidth_mbit=rate,
        direct=direct,
        relayed=relayed,
        overhead_ms=overhead,
        processing_per_crossing_ms=processing,
        ttft_overhead_ms=relayed.ttft_ms - direct.ttft_ms,
    )


def _measure(config: LabConfig, n_embd: int) -> SweepPoint:
    lab = Lab(config)
    try:
        lab.build()
        return measure_point(lab, start_swarm(lab), n_embd)
    finally:
        lab.close()


def run_relay_sweep(
    base: LabConfig,
    output: Path,
    n_embd: int,
    *,
    delays_ms: Sequence[float] = SWEEP_DELAYS_MS,
    rates_mbit: Sequence[float] = SWEEP_RATES_MBIT,
    progress: Callable[[str], object] = print,
) -> dict[str, object]:
    """Every point of the grid, direct then relayed, each in a lab of its own; writes ``output``."""
    if base.nodes < 3 or base.private != 1:
        raise InvalidArgument("the relay sweep compares one private middle node: give --nodes 3 (or more) --private 1")
    points = []
    for rate in rates_mbit:
        for delay in delays_ms:
            shape = dataclasses.replace(base, delay_ms=delay, bandwidth_mbit=rate, relays=1)
            direct = _measure(dataclasses.replace(shape, private=0), n_embd)
            relayed = _measure(shape, n_embd)
            point = compare(delay, rate, direct, relayed)
            points.append(point)
            progress(
                f"{delay:g} ms x {rate:g} Mbit: direct {direct.per_token_ms:.2f}, relayed {relayed.per_token_ms:.2f} "
                f"ms/token (+{point.overhead_ms:.2f}; {point.processing_per_crossing_ms:.2f} ms beyond the delay)"
            )
    results: dict[str, object] = {
        "schema": "meshnet-lab-relay-sweep/1",
        "model": base.model.name,
        "nodes": base.nodes,
        "memory_mb": base.memory_mb,
        "context": base.context,
        "route": "ring through 3 nodes; relayed: node 0 reaches the private middle node through the relay node",
        "extra_delays_per_token": EXTRA_DELAYS_PER_TOKEN,
        "relay_crossings_per_token": RELAY_CROSSINGS_PER_TOKEN,
        "processing_budget_ms": PROCESSING_BUDGET_MS,
        "created_unix_s": time.time(),
        "points": [dataclasses.asdict(point) for point in points],
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    return results
