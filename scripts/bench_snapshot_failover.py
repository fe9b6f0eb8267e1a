"""Long-session failover: time to the next token resumed from a KV snapshot vs replayed from 0.

    python scripts/bench_snapshot_failover.py [--model GGUF] [--prompt 500] [--tokens 1500]
        [--at 1500] [--every 256] [--out bench/results/snapshot_failover.json]

Three ``meshnet worker`` processes (loopback, the model split evenly, ``--snapshot-every``)
serve one greedy session of ``--prompt`` random prompt tokens and ``--tokens`` to generate,
whose route is lost once it fed ``--at`` positions (its shards snapshotted what it fed). The
session is then failed over as the swarm client does: opened again under its id on a newer route
epoch with the history generated so far, once resumed from the newest snapshot every hop holds
(``RouteDriver.resume``) and once replayed from its first token. Each is timed from the opening
to its first new token, which must be the uninterrupted run's. The failure's detection and the
tracker's new route are not in these figures (they are the same either way), and the replacement
restores its snapshot from its own disk here, as a spare restores the copy its lost peer sent
it. The export's own cost (one slot's KV copied out between engine ticks) is measured in process
on the head's layers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.core.events import TokenGenerated
from meshnet.core.generation import GenerationRequest, SamplingParams
from meshnet.core.ids import new_request_id, new_session_id
from meshnet.core.layers import LayerRange, split_evenly
from meshnet.core.snapshot import SnapshotPlan
from meshnet.deploy.launch.commands import INSECURE, worker_command
from meshnet.deploy.launch.ready_lines import WorkerLine
from meshnet.engine.backend import StepInput
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.shards import open_llama_shard
from meshnet.node.config import LayerChoice, WorkerConfig
from meshnet.process.launcher import ChildProcess, LaunchSpec, launch_all, stop_all
from meshnet.route.driver import RouteDriver
from meshnet.route.route_run import RouteSession
from meshnet.route.shard_admin import describe_hop, fetch_metrics
from meshnet.route.shard_stream import ChannelPool
from meshnet.wire.ticket_wire import issue_ticket

MODEL = Path("/work/main/.data/models/SmolLM2-135M-Instruct.Q4_1.gguf")
CHUNK = 256


def _workers(model: Path, n_layers: int, data_dir: Path, every: int, context: int) -> list[ChildProcess]:
    specs = []
    for layers in split_evenly(n_layers, 3):
        config = WorkerConfig(
            model=model,
            layer_choice=LayerChoice(layers),
            data_dir=data_dir / f"worker-{layers.start}",
            port=0,
            threads=1,
            max_sessions=2,
            n_ctx_per_session=context,
            prefill_chunk=CHUNK,
            snapshot_every=every,
            prefix_cache_mb=0,
        )
        log = data_dir / f"worker-{layers.start}.log"
        specs.append(LaunchSpec(f"worker {layers}", worker_command(config, INSECURE), log, WorkerLine.PREFIX))
    return launch_all(specs, 300.0)


async def _route(pool: ChannelPool, workers: Sequence[ChildProcess], session: str, epoch: int) -> RouteSession:
    ready = [WorkerLine.read(w.ready) for w in workers if w.ready is not None]
    hops = tuple([await describe_hop(pool, line.address, line.node_id) for line in ready])
    request_id, fingerprint = new_request_id(), ready[0].recipe
    ticket = issue_ticket(
        hops,
        session_id=session,  # type: ignore[arg-type]
        request_id=request_id,
        epoch=epoch,
        fingerprint=fingerprint,
        holder=None,
        now_unix_s=time.time(),
        seconds=3600.0,
        signer=None,
    )
    return RouteSession(request_id, session, hops, fingerprint, epoch, ticket)  # type: ignore[arg-type]


async def _first_token(
    driver: RouteDriver,
    route: RouteSession,
    request: GenerationRequest,
    history: Sequence[int],
    snapshot: SnapshotPlan | None,
) -> tuple[float, int]:
    started = time.perf_counter()
    events = driver.run(route, request, history=history, kv=None, snapshot=snapshot)
    try:
        async for event in events:
            if isinstance(event, TokenGenerated):
                return time.perf_counter() - started, event.token_id
    finally:
        await events.aclose()
    raise RuntimeError("the resumed session generated nothing")


async def _measure(workers: Sequence[ChildProcess], prompt: tuple[int, ...], tokens: int, at: int) -> dict[str, Any]:
    pool = ChannelPool(64 << 20)
    driver = RouteDriver(pool, max_frame_bytes=64 << 20)
    session = new_session_id()
    request = GenerationRequest(prompt, tokens, SamplingParams())
    try:
        # The lost route: it generated up to position ``at`` (what it fed was snapshotted) and died.
        route = await _route(pool, workers, session, 0)
        started, generated = time.perf_counter(), []
        async for event in driver.run(route, replace(request, max_tokens=at - len(prompt) + 1), kv=None):
            if isinstance(event, TokenGenerated):
                generated.append(event.token_id)
        lost_s = time.perf_counter() - started
        history = tuple(generated[: at - len(prompt)])
        resumed_route = await _route(pool, workers, session, 1)
        plan = await driver.resume(resumed_route, request, history)
        snapshot_s, first = await _first_token(driver, resumed_route, request, history, plan)
        replay_s, again = await _first_token(driver, await _route(pool, workers, session, 2), request, history, None)
        if not first == again == generated[len(history)]:
            raise RuntimeError(f"a failover must continue as the lost route would: {first}, {again}")
        disks = [await fetch_metrics(pool, WorkerLine.read(w.ready).address) for w in workers if w.ready is not None]
    finally:
        await pool.close()
    return {
        "session_tokens": len(prompt) + tokens,
        "lost_route_s": round(lost_s, 3),
        "failed_at_position": len(prompt) + len(history),
        "snapshot_position": None if plan is None else plan.position,
        "next_token_with_snapshot_s": round(snapshot_s, 3),
        "next_token_replaying_from_0_s": round(replay_s, 3),
        "positions_recomputed_with_snapshot": len(prompt) + len(history) - (0 if plan is None else plan.position),
        "positions_recomputed_replaying": len(prompt) + len(history),
        "snapshot_disk_bytes_per_worker": [int(d["snapshot_disk_bytes"]) for d in disks],
        "snapshots_taken_per_worker": [int(d["snapshots_taken_total"]) for d in disks],
    }


def _export_cost(model: Path, cache: Path, positions: int) -> dict[str, float]:
    """One slot's KV export on the head's layers after ``positions`` prefilled positions."""
    description = describe_model(model)
    layers = split_evenly(description.n_layers, 3)[0]
    config = LlamaConfig(n_threads=1, max_slots=1, n_ctx_per_slot=positions + CHUNK, max_batch_tokens=CHUNK)
    backend = open_llama_shard(description, LayerRange(layers.start, layers.stop), SliceCache(cache), config)
    try:
        tokens = np.random.default_rng(1).integers(100, 1000, positions).astype(np.int32)
        for start in range(0, positions, CHUNK):
            backend.run([StepInput(0, start, tokens=tokens[start : start + CHUNK], want_logits="none")])
        timings, size = [], 0
        for _ in range(5):
            started = time.perf_counter()
            size = len(backend.export_slot(0))
            timings.append(time.perf_counter() - started)
        return {
            "positions": positions,
            "layers": f"{layers}",
            "bytes": size,
            "median_ms": round(1000 * sorted(timings)[2], 2),
        }
    finally:
        backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--prompt", type=int, default=500)
    parser.add_argument("--tokens", type=int, default=1500)
    parser.add_argument("--at", type=int, default=1500)
    parser.add_argument("--every", type=int, default=256)
    parser.add_argument("--out", type=Path, default=Path("bench/results/snapshot_failover.json"))
    args = parser.parse_args()
    n_layers = describe_model(args.model).n_layers
    prompt = tuple(int(t) for t in np.random.default_rng(0).integers(100, 1000, args.prompt))
    with tempfile.TemporaryDirectory() as tmp:
        workers = _workers(args.model, n_layers, Path(tmp), args.every, args.prompt + args.tokens + CHUNK)
        try:
            figures = asyncio.run(_measure(workers, prompt, args.tokens, args.at))
        finally:
            stop_all(workers, 5.0)
        figures["export"] = _export_cost(args.model, Path(tmp) / "cache", 1536)
    figures |= {"model": args.model.name, "prompt_tokens": args.prompt, "snapshot_every": args.every}
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
