"""Milliseconds per ChooseRoute in the tracker's registry, at 100 to 3,000 simulated nodes.

A realistic swarm of one model (30 layers, nodes of 2-10 layers starting on even boundaries,
claimed rates 20-200 tok/s, 12-entry peer round-trip lists naming mostly the nodes that could
follow them, a few measured route timings), driven through ``NodeRegistry`` in process: 15
heartbeats between two routes (1,500 heartbeats/s beside 100 routes/s), each route a new session.

Scenarios (the routes are timed, heartbeats timed apart):

* ``cache_hits``: heartbeats repeat each node's load and jitter its round trips within the plan
  cache's tolerance, so the model's plan stays valid between routes;
* ``cache_misses``: every heartbeat changes its node's queue depth, so every route is planned;
* ``planner``: the pure ``choose_model_route`` on the registry's views and a plain latency dict;
* ``replan``: a plan cache miss as the tracker pays it (the registry's indexed tables, its
  cache emptied before each route);
* ``timing_between_routes``: as ``cache_hits``, but a gateway's timing of the last route arrives
  before each route (one timing per served request: 100 timings/s beside 100 routes/s), so
  every route follows a change of the measured routes and the believed rates it moves
  (``ReportRouteTiming`` timed apart, as ``timing``).

Old versus new is the same script over two trees, merged into one JSON by ``--label`` (labels
``old``/``new``: before issue 36 / the route index; ``m36``/``fit36``: the whole fit per
change of the measured routes / the incremental beliefs, ``--scenarios timing_between_routes``):

    PYTHONPATH=/path/to/old/src python scripts/bench_route_planning.py --label old
    PYTHONPATH=src python scripts/bench_route_planning.py --label new

(The swarm's records come from ``meshnet.bench.sample_nodes``: a tree older than that module
is measured with this script as that tree has it; its records are the same.)

The machine is noisy: compare the labels within one file, measured back to back.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from meshnet.bench.sample_nodes import certification, node_record, sample_recipe
from meshnet.core.errors import NoRoute
from meshnet.core.ids import NodeId, SessionId
from meshnet.core.node_record import NodeRecord
from meshnet.core.tracking import NodeLoad, RouteQuery, RouteTiming
from meshnet.tracker.registry import NodeRegistry
from meshnet.tracker.routing import choose_model_route

N_LAYERS = 30
MODEL = "bench-model"
HEARTBEATS_PER_ROUTE = 15
RECIPE = sample_recipe(N_LAYERS)
CERTIFICATION = certification(RECIPE, checks=("bench",))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _record(index: int, rng: random.Random) -> NodeRecord:
    start = rng.randrange(0, N_LAYERS, 2)
    stop = min(start + rng.choice([2, 4, 6, 8, 10]), N_LAYERS)
    rate = rng.uniform(20.0, 200.0)
    address = f"10.{index // 250}.{index % 250}.1:9000"
    return node_record(
        start,
        stop,
        address=address,
        decode_tokens_per_s=rate,
        recipe=RECIPE,
        model=MODEL,
        max_sessions=64,
        report=CERTIFICATION,
    )


class Swarm:
    """The registry under test and the simulated nodes' state."""

    def __init__(self, n_nodes: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.clock = Clock()
        self.registry = NodeRegistry(clock=self.clock, heartbeat_interval_s=2.0)
        self.records = {NodeId(f"node-{index}"): _record(index, self.rng) for index in range(n_nodes)}
        for node_id, record in self.records.items():
            self.registry.register(record, node_id)
        followers: dict[int, list[str]] = {}
        for record in self.records.values():
            followers.setdefault(record.layers.start, []).append(record.address)
        addresses = [record.address for record in self.records.values()]
        self.peers = {}
        for node_id, record in self.records.items():
            near = followers.get(record.layers.stop, [])
            named = self.rng.sample(near, min(12, len(near)))
            named += self.rng.sample(addresses, 12 - len(named))
            self.peers[node_id] = {address: self.rng.uniform(0.5, 20.0) for address in named}
        self.order = list(self.records)
        self.next_beat = 0
        self.queues = dict.fromkeys(self.records, 0)
        self.sessions = 0

    def heartbeat(self, *, vary_queue: bool) -> None:
        node_id = self.order[self.next_beat % len(self.order)]
        self.next_beat += 1
        self.clock.now += 1.0 / 1500.0
        if vary_queue:
            self.queues[node_id] = self.rng.choice([0, 1, 2])
        jitter = self.rng.uniform(-0.4, 0.4)  # one way: within the plan cache's 1 ms tolerance
        peers = tuple((address, max(rtt + jitter, 0.01)) for address, rtt in self.peers[node_id].items())
        load = NodeLoad(free_sessions=48, queue_depth=self.queues[node_id], peer_rtt_ms=peers)
        self.registry.heartbeat(node_id, load)

    def route(self) -> tuple[NodeId, ...]:
        self.sessions += 1
        query = RouteQuery(model=MODEL, session_id=SessionId(f"s-{self.sessions}"))
        return self.registry.choose_route(query).node_ids

    def warm_up(self) -> None:
        """Every node heartbeats once (its peer list reaches the tracker), a few routes are
        timed: the steady state a swarm runs in, not the first seconds after a mass join."""
        for _ in self.order:
            self.heartbeat(vary_queue=False)
        self.measure_some_routes(8)

    def measure_some_routes(self, count: int) -> None:
        """A few routes timed by gateways, so believed rates come from a fit as in production."""
        for _ in range(count):
            hops = self.route()
            self.registry.observe_route(RouteTiming(hops, self.rng.uniform(40.0, 120.0), tokens=16))


def _summary(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"median_ms": round(statistics.median(ordered), 4), "p99_ms": round(p99, 4), "samples": len(ordered)}


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000.0


def run_scenario(n_nodes: int, routes: int, *, vary_queue: bool, seed: int, timings: bool = False) -> dict[str, object]:
    swarm = Swarm(n_nodes, seed)
    swarm.warm_up()
    route_ms: list[float] = []
    heartbeat_ms: list[float] = []
    timing_ms: list[float] = []
    route_cpu_ms: list[float] = []
    hops = swarm.route()
    for _ in range(routes):
        for _ in range(HEARTBEATS_PER_ROUTE):
            heartbeat_ms.append(_timed(lambda: swarm.heartbeat(vary_queue=vary_queue)))
        if timings:
            timing = RouteTiming(hops, swarm.rng.uniform(40.0, 120.0), tokens=16)
            timing_ms.append(_timed(functools.partial(swarm.registry.observe_route, timing)))
        started, cpu_started = time.perf_counter(), time.process_time()
        hops = swarm.route()
        route_ms.append((time.perf_counter() - started) * 1000.0)
        route_cpu_ms.append((time.process_time() - cpu_started) * 1000.0)
    # CPU time besides wall time: on a shared machine it leaves out other processes' turns.
    summary = {"route": _summary(route_ms), "route_cpu": _summary(route_cpu_ms), "heartbeat": _summary(heartbeat_ms)}
    return summary | ({"timing": _summary(timing_ms)} if timings else {})


def run_planner(n_nodes: int, routes: int, *, seed: int) -> dict[str, object]:
    swarm = Swarm(n_nodes, seed)
    swarm.warm_up()
    views = swarm.registry.node_views()
    latency = dict(swarm.registry.latency_table())
    samples = [_timed(lambda: choose_model_route(views, MODEL, latency_ms=latency)) for _ in range(routes)]
    return {"route": _summary(samples)}


def run_replan(n_nodes: int, routes: int, *, seed: int) -> dict[str, object]:
    """A cache miss as the tracker pays it: the registry's own indexed tables, the plan forgotten."""
    swarm = Swarm(n_nodes, seed)
    swarm.warm_up()
    cache = swarm.registry._index.cache

    def replanned() -> None:
        cache.forget_all()
        swarm.route()

    return {"route": _summary([_timed(replanned) for _ in range(routes)])}


SCENARIOS: dict[str, Callable[[int, int], dict[str, object]]] = {
    "cache_hits": lambda n_nodes, routes: run_scenario(n_nodes, routes, vary_queue=False, seed=n_nodes),
    "cache_misses": lambda n_nodes, routes: run_scenario(n_nodes, routes, vary_queue=True, seed=n_nodes),
    "planner": lambda n_nodes, routes: run_planner(n_nodes, routes, seed=n_nodes),
    "replan": lambda n_nodes, routes: run_replan(n_nodes, routes, seed=n_nodes),
    "timing_between_routes": lambda n_nodes, routes: run_scenario(
        n_nodes, routes, vary_queue=False, seed=n_nodes, timings=True
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", required=True, help="old or new: which tree's code this run measures")
    parser.add_argument("--sizes", default="100,300,1000,3000")
    parser.add_argument("--routes", type=int, default=200, help="routes timed per scenario and size")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="fewer routes where one is slow")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="which of " + ", ".join(SCENARIOS))
    parser.add_argument("--out", type=Path, default=Path("bench/results/tracker_scale/route_planning.json"))
    args = parser.parse_args()
    results: dict[str, dict[str, object]] = {}
    for n_nodes in (int(size) for size in args.sizes.split(",")):
        probe = run_scenario(n_nodes, 3, vary_queue=True, seed=n_nodes, timings=True)["route"]
        per_route_s = float(probe["median_ms"]) / 1000.0  # type: ignore[index]
        routes = max(10, min(args.routes, int(args.max_seconds / max(per_route_s * 3, 1e-6))))
        try:
            results[str(n_nodes)] = {name: SCENARIOS[name](n_nodes, routes) for name in args.scenarios.split(",")}
        except NoRoute as refused:
            results[str(n_nodes)] = {"no_route": refused.message}
        print(n_nodes, json.dumps(results[str(n_nodes)]), flush=True)
    document = json.loads(args.out.read_text()) if args.out.exists() else {}
    document.setdefault("runs", {}).setdefault(args.label, {}).update(results)
    document["machine"] = f"{platform.processor() or platform.machine()}, Python {platform.python_version()}"
    document["note"] = (
        "ms per ChooseRoute through NodeRegistry with 15 heartbeats between routes (not timed with them); "
        "old = the tracker before issue 36, new = route index + boundary-ordered planner + plan cache; "
        "m36 = new with the whole believed-speed fit redone after every route timing, fit36 = incremental beliefs "
        "(timing_between_routes: one ReportRouteTiming before each route, timed apart as timing); "
        "main37 = the tracker at the start of 2026-12-05, plan37 = bounded planner (replan: a cache miss). "
        "Noisy shared machine: compare old and new within this file."
    )
    document["ratios_old_over_new"] = _ratios(document["runs"], "old", "new")
    document["ratios_m36_over_fit36"] = _ratios(document["runs"], "m36", "fit36")
    document["ratios_main37_over_plan37"] = _ratios(document["runs"], "main37", "plan37")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")


def _ratios(
    runs: dict[str, dict[str, dict[str, dict[str, dict[str, float]]]]], before: str, after: str
) -> dict[str, dict[str, float]]:
    """``before``'s median over ``after``'s, per size and scenario, where both ran."""
    old, new = runs.get(before, {}), runs.get(after, {})
    ratios: dict[str, dict[str, float]] = {}
    for size, scenarios in new.items():
        for scenario, figures in scenarios.items():
            before = old.get(size, {}).get(scenario)
            if isinstance(figures, dict) and isinstance(before, dict):
                ratio = before["route"]["median_ms"] / max(figures["route"]["median_ms"], 1e-9)
                ratios.setdefault(size, {})[scenario] = round(ratio, 1)
    return ratios


if __name__ == "__main__":
    main()
