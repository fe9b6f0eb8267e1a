"""Fetch throughput of one layer range from 1 holder vs 2 holders on loopback (bench JSON).

    python scripts/bench_artifact_fetch.py MODEL.gguf --out bench/results/artifact_fetch.json

Publishes MODEL once, starts a tracker and two seeder processes, then fetches the whole model
(every artifact) into a fresh data dir per run, alternating 1-holder and 2-holder runs for
``--rounds`` rounds; reports each run and the medians. One machine: both seeders and the
fetcher share its cores, so the ratio says how well fetches spread, not what a LAN would give.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from meshnet.artifact.publish import PublishOptions, publish
from meshnet.core.layers import LayerRange
from meshnet.deploy.launch.commands import INSECURE, seed_command
from meshnet.deploy.launch.ready_lines import SeedLine
from meshnet.fetch.fetcher import FetchConfig, fetch_range
from meshnet.membership.tracker_client import TrackerClient
from meshnet.node.artifact_server import SeedConfig
from meshnet.process.launcher import ChildProcess, LaunchSpec, stop_all
from meshnet.security.signing import load_or_create_key
from meshnet.tracker.config import TrackerConfig
from meshnet.tracker.server import start_tracker


def start_seeder(folder: Path, name: str, directory: Path, tracker: str) -> ChildProcess:
    # Plaintext like the in-process tracker below: the measured numbers predate mTLS on this plane.
    command = seed_command(SeedConfig(directory, tracker=tracker), folder / name, INSECURE)
    child = ChildProcess(LaunchSpec(name, command, folder / f"{name}.log", SeedLine.PREFIX))
    child.await_ready(time.monotonic() + 60)
    return child


async def wait_holders(tracker: str, model_id: str, count: int) -> None:
    async with TrackerClient(tracker) as client:
        while len((await client.find_holders(model_id)).holders) != count:
            await asyncio.sleep(0.1)


async def run(model: Path, rounds: int, folder: Path) -> dict[str, object]:
    key, _ = load_or_create_key(folder / "publisher.key")
    manifest = publish(model, folder / "pub-a", PublishOptions("bench-model", "unknown"), key)
    shutil.copytree(folder / "pub-a", folder / "pub-b")
    n_layers = manifest.n_layers
    tracker = await start_tracker(TrackerConfig(port=0, db_path=folder / "tracker.sqlite3", heartbeat_interval_s=0.5))
    runs: list[dict[str, object]] = []
    first = start_seeder(folder, "seed-a", folder / "pub-a", tracker.address)
    second: ChildProcess | None = None
    try:
        for index in range(rounds * 2):
            holders = 1 + index % 2
            if holders == 2 and second is None:
                second = start_seeder(folder, "seed-b", folder / "pub-b", tracker.address)
            elif holders == 1 and second is not None:
                stop_all([second])
                second = None
            await asyncio.sleep(1.6)  # let a stopped holder's announcement expire (ttl 1.5 s)
            await wait_holders(tracker.address, "bench-model", holders)
            target = folder / f"node-{index}"
            fetched = await fetch_range(FetchConfig("bench-model", LayerRange(0, n_layers), tracker.address, target))
            runs.append({
                "holders": holders,
                "bytes": fetched.fetched_bytes,
                "seconds": round(fetched.seconds, 4),
                "mb_per_s": round(fetched.fetched_bytes / fetched.seconds / 1e6, 2),
            })  # fmt: skip
            shutil.rmtree(target)
    finally:
        stop_all([c for c in (first, second) if c is not None])
        await tracker.stop(0.5)
    medians = {
        str(h): statistics.median(float(r["mb_per_s"]) for r in runs if r["holders"] == h)  # type: ignore[arg-type]
        for h in (1, 2)
    }
    return {
        "benchmark": "artifact-fetch",
        "model": model.name,
        "source_bytes": manifest.source.size,
        "range": f"0:{n_layers}",
        "piece_bytes": manifest.artifacts[0].piece_size,
        "requests_per_holder": 2,
        "rounds": rounds,
        "machine": {"cpus": __import__("os").cpu_count(), "platform": platform.platform()},
        "runs": runs,
        "median_mb_per_s": medians,
        "two_vs_one": round(medians["2"] / medians["1"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="meshnet-fetch-bench-") as raw:
        result = asyncio.run(run(args.model, args.rounds, Path(raw)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("median_mb_per_s", "two_vs_one")}))


if __name__ == "__main__":
    main()
