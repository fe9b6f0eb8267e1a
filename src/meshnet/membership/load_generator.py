"""The tracker load generator: N simulated nodes plus gateway-like route and work-record load.

Run as its own process (``python -m meshnet.membership.load_generator SPEC.json``; the bench's
``tracker_scale`` starts it pinned to a core of its own) against a tracker process started
apart. It mints the nodes' and the gateway's certificates from the swarm CA in the data dir
(acting as the swarm's admin), serves each node's dial-back address, registers the nodes (all
at once for a mass join, else spread over one heartbeat interval), lets the load settle for
``warmup_s``, then counts for ``measure_s`` and prints one JSON object on stdout: latencies,
errors by call and status, live nodes the tracker wrongly forgot, the tracker's CPU and memory
(psutil on ``tracker_pid``), and the generator's own lag, with ``valid`` false and the reason
when the generator fell behind (its numbers then say nothing of the tracker).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, get_args

import psutil

from meshnet.core.addresses import TrackerOrder
from meshnet.core.errors import InvalidArgument
from meshnet.core.ids import NodeId, new_node_id
from meshnet.core.tracking import DEFAULT_HEARTBEAT_TRANSPORT, HeartbeatTransport
from meshnet.membership.disruptions import Kill, measure_with_kills
from meshnet.membership.gateway_load import GatewayLoad
from meshnet.membership.load_figures import Histogram, ProcessMeter, bucket, percentile, summary, to_json
from meshnet.membership.simulated_nodes import (
    PEERS_PER_HEARTBEAT,
    AnsweringPorts,
    Counts,
    SimulatedNode,
    layer_ranges,
    simulated_recipe,
    simulated_record,
)
from meshnet.process.collector import pace_collector
from meshnet.security.certificates import NodeCertificate, mint_node
from meshnet.security.swarm_dir import load_authority
from meshnet.wire.tls import LinkSecurity

LAG_PROBE_S = 0.05
"""How often the lag probe sleeps; its oversleep is the event loop's lag."""
MAX_LAG_P99_MS = 100.0
"""Past this the generator sends late enough to distort what it measures: the run is invalid."""
CALLS = ("heartbeat", "choose_route", "report_work", "register")
JOIN_TIMEOUT_S = 60.0
"""How long the join may take before load starts anyway (plus a little per node)."""


@dataclass(frozen=True)
class LoadSpec:
    """One load point, as the bench hands it to the generator process (a JSON file)."""

    trackers: tuple[str, ...]
    """Tracker addresses (replicas); each node asks them in ``tracker_order`` and moves on when
    one is unavailable."""
    data_dir: Path | None
    """Where the swarm CA is; None: a plaintext (``--insecure``) tracker."""
    nodes: int
    routes_per_s: float
    records_per_s: float
    warmup_s: float
    measure_s: float
    mass_join: bool = False
    n_layers: int = 30
    tracker_pid: int | None = None
    join_spread_s: float = 2.0
    """Registrations are spread over this (one heartbeat interval) unless ``mass_join``."""
    host: str = "127.0.0.1"
    seed: int = 0
    heartbeat_transport: HeartbeatTransport = DEFAULT_HEARTBEAT_TRANSPORT
    """How the nodes heartbeat: on a stream each (as workers do) or with unary calls."""
    kills: tuple[Kill, ...] = ()
    """Processes to SIGKILL during the measured span (``membership.disruptions``)."""
    acknowledged_path: Path | None = None
    """Where to write the request ids of every work record a tracker acknowledged (a JSON list)."""
    tracker_order: TrackerOrder = "spread"
    """spread: each node ranks the replicas by its node id and the gateway by its certificate's,
    as workers and gateways do; listed: all start at the first listed (as before they spread)."""

    def __post_init__(self) -> None:
        if not self.trackers or self.nodes < 1 or self.n_layers < 2:
            raise InvalidArgument("a load spec needs a tracker address, at least one node and two layers")
        if min(self.routes_per_s, self.records_per_s, self.warmup_s) < 0 or self.measure_s <= 0:
            raise InvalidArgument("rates and warm-up must be >= 0 and the measured span > 0")
        if self.heartbeat_transport not in get_args(HeartbeatTransport):
            raise InvalidArgument(f"heartbeat transport must be stream or unary, got {self.heartbeat_transport!r}")

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["trackers"] = list(self.trackers)
        document["data_dir"] = None if self.data_dir is None else str(self.data_dir)
        document["acknowledged_path"] = None if self.acknowledged_path is None else str(self.acknowledged_path)
        document["kills"] = [asdict(kill) for kill in self.kills]
        return document

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> LoadSpec:
        fields = dict(document)
        fields["trackers"] = tuple(fields["trackers"])
        fields["data_dir"] = None if fields.get("data_dir") is None else Path(fields["data_dir"])
        path = fields.get("acknowledged_path")
        fields["acknowledged_path"] = None if path is None else Path(path)
        try:
            fields["kills"] = tuple(Kill(**kill) for kill in fields.get("kills", ()))
            return cls(**fields)
        except TypeError as error:
            raise InvalidArgument(f"malformed load spec: {error}") from None


def _certificates(spec: LoadSpec) -> tuple[list[NodeCertificate | None], NodeCertificate | None, list[NodeId]]:
    ids = [NodeId(new_node_id("worker")) for _ in range(spec.nodes)]
    if spec.data_dir is None:
        return [None] * spec.nodes, None, ids
    authority, now = load_authority(spec.data_dir), time.time()
    nodes: list[NodeCertificate | None] = [
        mint_node(authority, node_id=node_id, role="worker", now_unix_s=now) for node_id in ids
    ]
    gateway = mint_node(authority, node_id=new_node_id("gateway"), role="gateway", now_unix_s=now)
    return nodes, gateway, ids


def build_nodes(
    spec: LoadSpec, ports: AnsweringPorts, counts: Counts
) -> tuple[list[SimulatedNode], NodeCertificate | None]:
    certificates, gateway, ids = _certificates(spec)
    rng = random.Random(spec.seed)
    recipe = simulated_recipe(spec.n_layers)
    nodes: list[SimulatedNode] = []
    for node_id, certificate, layers in zip(
        ids, certificates, layer_ranges(spec.nodes, spec.n_layers, rng), strict=True
    ):
        address = ports.bind(None if certificate is None else LinkSecurity(certificate))
        record = simulated_record(address, layers, recipe)
        nodes.append(
            SimulatedNode(
                node_id, certificate, record, spec.trackers, counts, spec.heartbeat_transport, spec.tracker_order
            )
        )
    addresses = [node.record.address for node in nodes]
    for node in nodes:
        peers = rng.sample(addresses, min(PEERS_PER_HEARTBEAT, len(addresses)))
        node.peers = tuple((peer, round(rng.uniform(0.2, 40.0), 2)) for peer in peers)
    return nodes, gateway


async def probe_lag(counts: Counts, stop: asyncio.Event) -> None:
    while not stop.is_set():
        before = time.monotonic()
        await asyncio.sleep(LAG_PROBE_S)
        counts.loop_lag[bucket(max(0.0, time.monotonic() - before - LAG_PROBE_S) * 1000.0)] += 1


async def _joined(nodes: list[SimulatedNode], timeout_s: float) -> float:
    """Seconds until every node is registered (or ``timeout_s``, whichever comes first)."""
    started = time.monotonic()
    while not all(node.registered for node in nodes) and time.monotonic() - started < timeout_s:
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def _sample_until(meters: list[ProcessMeter], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        for meter in meters:
            meter.sample()
        await asyncio.sleep(min(1.0, left))


def _join_summary(counts: Counts, nodes: list[SimulatedNode], join_s: float) -> dict[str, Any]:
    """How the registrations went (a mass join's whole story is here and in the next intervals)."""
    registers = counts.latencies.get("register", Counter())
    return {
        "seconds": round(join_s, 3),
        "registered": sum(node.registered for node in nodes),
        "register": summary(registers, max(join_s, 1e-3)),
        "register_histogram": to_json(registers),
        "errors": dict(sorted(counts.errors.items())),
    }


def judge_lag(lag: Histogram) -> tuple[bool, str | None]:
    """Whether the generator kept up (its event loop woke sleepers on time), and if not why."""
    lag_p99 = percentile(lag, 0.99)
    if lag_p99 is None or lag_p99 > MAX_LAG_P99_MS:
        return False, f"the generator fell behind: event-loop lag p99 {lag_p99} ms > {MAX_LAG_P99_MS} ms"
    return True, None


def summarize(spec: LoadSpec, counts: Counts, tracker: ProcessMeter, own: ProcessMeter) -> dict[str, Any]:
    valid, invalid_reason = judge_lag(counts.loop_lag)
    return {
        "nodes": spec.nodes,
        "routes_per_s": spec.routes_per_s,
        "records_per_s": spec.records_per_s,
        "mass_join": spec.mass_join,
        "heartbeat_transport": spec.heartbeat_transport,
        "trackers": list(spec.trackers),
        "warmup_s": spec.warmup_s,
        "measure_s": spec.measure_s,
        "calls": {call: summary(counts.latencies.get(call, Counter()), spec.measure_s) for call in CALLS},
        "histograms": {call: to_json(counts.latencies.get(call, Counter())) for call in CALLS},
        "errors": dict(sorted(counts.errors.items())),
        "error_examples": dict(sorted(counts.error_examples.items())),
        "gateway_calls_retried": counts.retries,
        "gateway_calls_failed": {call: counts.failed_calls[call] for call in ("choose_route", "report_work")},
        "live_nodes_wrongly_expired": counts.unknown_replies,
        "reregistrations": counts.reregistrations,
        "records_skipped_nothing_routed": counts.skipped_records,
        "tracker": {"cpu_cores": tracker.cores(), "peak_rss_bytes": tracker.peak_rss_bytes},
        "generator": {
            "cpu_cores": own.cores(),
            "peak_rss_bytes": own.peak_rss_bytes,
            "loop_lag_p50_ms": percentile(counts.loop_lag, 0.50),
            "loop_lag_p99_ms": percentile(counts.loop_lag, 0.99),
            "loop_lag_histogram": to_json(counts.loop_lag),
        },
        "valid": valid,
        "invalid_reason": invalid_reason,
    }


async def run_load(spec: LoadSpec) -> dict[str, Any]:
    """Start the nodes and the gateway load, warm up, measure, stop; the summary of the span."""
    counts = Counts()
    ports = AnsweringPorts(spec.host)
    nodes, gateway_certificate = build_nodes(spec, ports, counts)
    gateway = GatewayLoad(
        spec.trackers, (spec.routes_per_s, spec.records_per_s), gateway_certificate, counts, spec.tracker_order
    )
    await ports.start()
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        # A mass join: every node at once, as after a tracker restart. Else spread over one interval.
        gap_s = 0.0 if spec.mass_join else spec.join_spread_s / len(nodes)
        tasks += [asyncio.create_task(node.run(stop, index * gap_s)) for index, node in enumerate(nodes)]
        join = _join_summary(counts, nodes, await _joined(nodes, JOIN_TIMEOUT_S + spec.nodes / 20))
        # The instrument must not pause: 3,000 nodes' channels made full collections stop this
        # loop for up to 0.5 s, which read as the tracker's latency (``process.collector``).
        pace_collector()
        tasks.append(asyncio.create_task(gateway.run(stop)))
        tasks.append(asyncio.create_task(probe_lag(counts, stop)))
        await asyncio.sleep(spec.warmup_s)
        warmup = {
            "live_nodes_wrongly_expired": counts.unknown_replies,
            "reregistrations": counts.reregistrations,
            "errors": dict(sorted(counts.errors.items())),
        }
        counts.reset()
        tracker, own = ProcessMeter(spec.tracker_pid), ProcessMeter(psutil.Process().pid)
        meters = [tracker, own]
        kills = await measure_with_kills(
            spec.kills, nodes, counts.new_phase, lambda seconds: _sample_until(meters, seconds), spec.measure_s
        )
        summary = {**summarize(spec, counts, tracker, own), "join": join, "warmup": warmup}
        if spec.kills:
            summary["disruptions"] = kills
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        if spec.acknowledged_path is not None:
            spec.acknowledged_path.write_text(json.dumps(gateway.acknowledged))
        await asyncio.gather(*(node.close() for node in nodes))
        await ports.stop()
    return summary


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m meshnet.membership.load_generator SPEC.json", file=sys.stderr)
        return 2
    spec = LoadSpec.from_json(json.loads(Path(argv[0]).read_text()))
    print(json.dumps(asyncio.run(run_load(spec))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
