"""Measure what real workers hold resident, to calibrate the memory cost model (core/layer_costs).

    python scripts/measure_worker_memory.py --models .data/models --out bench/results/worker-memory.json

For each configuration it starts a tracker, ``meshnet worker`` processes covering the model and
a gateway (loopback), runs one completion per session at once (each prompt
longer than a prefill chunk, so the chunk's compute buffers are used, then a few decode steps
batched across the sessions), and reads every worker's /proc status after the load: VmRSS
(what it holds now), VmHWM (its peak, start-up included), RssAnon and RssFile. The JSON records
each worker's range, sessions, context and chunk with those figures; ``tests/unit/core/
test_layer_costs.py`` checks the cost model against every one of them.

Every link runs mutual TLS, as users run it (identities minted from a swarm CA of the point's
own); ``--plaintext`` measures without it, to see what TLS holds.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from gguf import GGMLQuantizationType

from meshnet.artifact.footprint import memory_footprint
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.core.config_flags import render_arguments
from meshnet.deploy.launch.commands import minted_identity
from meshnet.deploy.launch.ready_lines import GatewayLine, TrackerLine, WorkerLine
from meshnet.gateway.keys import CLIENT_KEY_FILE, ApiKeyStore, new_api_key, store_path
from meshnet.node.config import WorkerConfig
from meshnet.process.launcher import ChildProcess, LaunchSpec, meshnet_command, stop_all
from meshnet.security.identity import Role

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = "gemma-3-270m-q4_k_m.gguf"
SYNTHETIC = SyntheticSpec(
    n_layers=8, n_embd=256, n_head=8, n_head_kv=2, n_ff=768, weight_type=GGMLQuantizationType.Q8_0, seed=3
)
START_S = 180.0
STORE_DEFAULT_MB = WorkerConfig.prefix_cache_mb
FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")
FILLER = (
    "Machines that share their work pass hidden states along a chain of workers; each holds a "
    "contiguous range of layers, its sessions' keys and values, and a little scratch. "
)
TOPICS = ("rivers", "clocks", "bread", "glaciers", "violins", "orbits", "moss", "ledgers")


@dataclass(frozen=True)
class Point:
    model: str
    ranges: tuple[str, ...]
    sessions: int
    context: int
    prefill_chunk: int = 256
    prompt_repeats: int = 12
    """Fillers in each prompt: more than one chunk of tokens, less than the context."""
    worker_flags: tuple[tuple[str, ...], ...] = ()
    """Extra flags for each worker, by range (``meshnet plan``'s --memory-budget-mb, for one)."""


POINTS = (
    Point(SMOLLM2, ("0:10", "10:20", "20:30"), 1, 2048),
    Point(SMOLLM2, ("0:10", "10:20", "20:30"), 4, 2048),
    Point(SMOLLM2, ("0:15", "15:30"), 8, 2048),
    Point(SMOLLM2, ("0:30",), 2, 2048),
    Point(SMOLLM2, ("0:13", "13:26", "26:30"), 1, 2048),
    Point(SMOLLM2, ("0:12", "12:24", "24:30"), 3, 1024),
    Point(SMOLLM2, ("0:15", "15:30"), 2, 2048, prefill_chunk=512, prompt_repeats=20),
    Point("synthetic", ("0:4", "4:8"), 2, 1024, prompt_repeats=2),
    Point("synthetic", ("0:8",), 6, 1024, prompt_repeats=2),
    Point("synthetic", ("0:3", "3:6", "6:8"), 8, 768, prompt_repeats=2),
    Point(GEMMA3, ("0:9", "9:18"), 2, 2048),
    # The README's three machines as ``--layers auto --memory-budget-mb 340`` places them, every
    # other flag at its default (8 sessions of 2,048 positions, chunks of 64): the budget nearly
    # filled. tests/integration/test_worker_auto_layers.py checks the budget itself, reuse store
    # included (``--budget-mb 340 --points 11`` here measures that too).
    Point(SMOLLM2, ("0:11", "11:23", "23:30"), 8, 2048, prefill_chunk=64),
)


def status(pid: int) -> dict[str, int]:
    """The memory lines of /proc/PID/status, in bytes."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in FIELDS:
            values[key] = int(rest.split()[0]) * 1024
    return values


def start(name: str, command: tuple[str, ...], root: Path, ready: str) -> tuple[ChildProcess, str]:
    """The started child and the first word of its ready line (its address)."""
    child = ChildProcess(LaunchSpec(name, command, root / f"{name}.log", ready))
    return child, child.await_ready(time.monotonic() + START_S).first


def identity(root: Path, name: str, role: Role, plaintext: bool) -> tuple[str, ...]:
    """``--identity`` flags of a certificate minted from ``root``'s swarm CA (or ``--insecure``)."""
    return ("--insecure",) if plaintext else tuple(render_arguments(minted_identity(root, name, role)))


def measure(
    point: Point, model: Path, root: Path, data_dir: Path, *, plaintext: bool = False
) -> list[dict[str, object]]:
    children: list[ChildProcess] = []
    try:
        # The tracker's data dir is ``root``: it holds the swarm CA the identities are minted from.
        command = meshnet_command(
            root, "tracker", "--port", "0", "--join-port", "0", *(("--insecure",) if plaintext else ())
        )
        tracker, address = start("tracker", command, root, TrackerLine.PREFIX)
        children.append(tracker)
        workers = []
        for index, text in enumerate(point.ranges):
            name = f"worker-{text.replace(':', '-')}"
            extra = point.worker_flags[index] if point.worker_flags else ()
            command = meshnet_command(
                data_dir,
                *("worker", "--model", str(model), "--model-name", "m", "--layers", text, "--tracker", address),
                *("--port", "0", "--threads", "1", "--max-sessions", str(point.sessions)),
                *identity(root, name, "worker", plaintext),
                # No prefix reuse store: the cost model leaves it out, the capacity plan gives it
                # what the budget has left after the modelled costs (``node.assembly``).
                *("--prefix-cache-mb", "0"),
                *("--context", str(point.context), "--prefill-chunk", str(point.prefill_chunk)),
                *extra,
            )
            workers.append(start(name, command, root, WorkerLine.PREFIX)[0])
            children.append(workers[-1])
        at_ready = [status(w.pid) for w in workers]
        key = new_api_key()
        home = root / "gateway"
        home.mkdir(parents=True, exist_ok=True)
        ApiKeyStore(store_path(home)).add("measure", key)
        (home / CLIENT_KEY_FILE).write_text(key + "\n")
        command = meshnet_command(
            home, "gateway", "--tracker", address, "--model", str(model), "--model-name", "m", "--port", "0"
        )
        command = (*command, *identity(root, "gateway", "gateway", plaintext), "--audit-fraction", "0")
        gateway, base = start("gateway", command, root, GatewayLine.PREFIX)
        children.append(gateway)
        _load(base, key, point.sessions, point.prompt_repeats)
        after = [status(w.pid) for w in workers]
        return [
            {
                "model": point.model,
                "layers": text,
                "sessions": point.sessions,
                "context": point.context,
                "prefill_chunk": point.prefill_chunk,
                "at_ready": ready,
                "after_load": loaded,
            }
            for text, ready, loaded in zip(point.ranges, at_ready, after, strict=True)
        ]
    finally:
        stop_all(children, 3.0)


def prompt(topic: str, repeats: int) -> str:
    """A prompt longer than one prefill chunk (``repeats`` fillers), different per topic."""
    return f"Here is a long note about {topic}. {FILLER * repeats}Now summarise the note about {topic}."


def _load(base: str, key: str, sessions: int, repeats: int) -> None:
    def one(index: int) -> None:
        body = {
            "model": "m",
            "prompt": prompt(TOPICS[index % len(TOPICS)], repeats),
            "max_tokens": 24,
            "temperature": 0,
        }
        reply = httpx.post(f"{base}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=300)
        if reply.status_code != 200:
            raise RuntimeError(f"{reply.status_code}: {reply.text}")

    with concurrent.futures.ThreadPoolExecutor(sessions) as pool:
        list(pool.map(one, range(sessions)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", type=Path, default=Path(".data/models"), help="folder holding SmolLM2 and Gemma 3")
    parser.add_argument("--only", help="measure only the points of this model file (or 'synthetic')")
    parser.add_argument("--plaintext", action="store_true", help="no TLS on the links (to see what TLS holds)")
    parser.add_argument(
        "--budget-mb",
        type=float,
        help="give every worker this --memory-budget-mb and its default prompt-reuse store, which the plan "
        "sizes to what the budget leaves (to see the store within its share; not a calibration)",
    )
    parser.add_argument("--points", help="measure only these points (indices into POINTS, comma-separated)")
    args = parser.parse_args()
    results = []
    footprints: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="meshnet-memory-") as raw:
        folder = Path(raw)
        synthetic = write_synthetic_model(folder / "synthetic.gguf", SYNTHETIC)
        for index, point in enumerate(POINTS):
            if args.only and point.model != args.only:
                continue
            if args.points and str(index) not in args.points.split(","):
                continue
            model = synthetic if point.model == "synthetic" else args.models / point.model
            # What the cost model reads from the header, so its test needs no model file.
            footprints[point.model] = dataclasses.asdict(memory_footprint(model))
            root = folder / f"point-{index}"
            # One data dir (slice cache) per model: a point's slices are cut once, not per start.
            if args.budget_mb is not None:
                budgeted = ("--memory-budget-mb", str(args.budget_mb), "--prefix-cache-mb", str(STORE_DEFAULT_MB))
                point = dataclasses.replace(point, worker_flags=(budgeted,) * len(point.ranges))
            results += measure(point, model, root, folder / point.model.removesuffix(".gguf"), plaintext=args.plaintext)
            print(json.dumps(results[-len(point.ranges) :]), flush=True)
    document = {
        "what": "resident memory of real meshnet workers after one completion per session",
        "machine": {"python": platform.python_version(), "machine": platform.machine()},
        "links": "plaintext" if args.plaintext else "mutual TLS",
        "budget_mb": args.budget_mb,
        "synthetic_spec": {k: str(v) for k, v in vars(SYNTHETIC).items()},
        "footprints": footprints,
        "workers": results,
    }
    args.out.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
